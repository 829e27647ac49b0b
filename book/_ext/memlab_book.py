"""The book's own Sphinx extension: offline-clean pages, the book's CSS/JS, the student edition.

- Ships ``book/_static/memlab.js`` and ``memlab.css`` (explorers, phone menus, figure zoom).
- Loads no widget JavaScript from a CDN: the static build has no widget views
  (``experiments.core.explorer``), so myst-nb's ``nb_ipywidgets_js`` is emptied.
- Drops duplicate inline scripts (sphinx-thebe's config is added twice by the pinned
  sphinx-thebe 0.3.1, which raises "Identifier 'THEBE_JS_URL' has already been declared").
- Sets the template's ``default_mode`` so that pydata-sphinx-theme does not log
  "Got invalid theme mode" on a first visit.
- With ``memlab_student = True`` (the student edition): no download button, whose
  notebooks carry the solutions (Jupyter Book 1 ignores ``html.use_download_button``),
  and no ``_sources/`` folder, where sphinx-book-theme copies the executed notebooks.
  Outputs that answer an exercise are withheld: a code cell whose metadata says
  ``memlab: {reveals: <exercise label>}`` (set in book/src) keeps its code and loses its
  output (a "Show the answer" fold, a measurement after a check), with a note in its place;
  with ``points: [{param: value}, ...]`` as well, only the explorer views at those points
  are withheld (an explorer above an exercise whose answer is one of its settings). The
  Colab set-up cell, which names the repository, is left out of the student pages.
"""
from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path

STATIC = Path(__file__).resolve().parent.parent / "_static"


def _config_inited(app, config):
    # pydata-sphinx-theme's layout.html reads it from the template context.
    config.html_context = {**config.html_context, "default_mode": config.html_context.get("default_mode", "auto")}
    config.nb_ipywidgets_js = {}
    config.html_static_path = [*config.html_static_path, str(STATIC)]


def _page_context(app, pagename, templatename, context, doctree):
    scripts, seen = [], set()
    for s in context.get("script_files", []):
        # One extension adds its inline script with filename None, another with '': the same script.
        key = (getattr(s, "filename", s) or "", repr(sorted(getattr(s, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            scripts.append(s)
    context["script_files"] = scripts
    if app.config.memlab_student:
        context["header_buttons"] = [b for b in context.get("header_buttons", [])
                                     if "download" not in str(b.get("tooltip", "")).lower()]


VIEW = re.compile(r'(<figure class="memlab-view" data-point="(?P<point>[^"]*)"(?P<rest>[^>]*)>)(?P<body>.*?)(</figure>)',
                  re.S)


def _matches(point: dict, specs: list) -> bool:
    return any(isinstance(spec, dict) and all(point.get(k) == v for k, v in spec.items()) for spec in specs)


def _withhold_points(node, specs: list, label: str) -> int:
    """Replace the explorer views at ``specs`` in the raw HTML under ``node``; returns how many."""
    from docutils import nodes

    count = 0
    for raw in list(node.findall(nodes.raw)):
        text = raw.astext()

        def sub(m):
            nonlocal count
            try:
                point = json.loads(html.unescape(m.group("point")))
            except ValueError:
                return m.group(0)
            if not (isinstance(point, dict) and _matches(point, specs)):
                return m.group(0)
            count += 1
            note = (f'<p class="memlab-withheld"><em>Withheld in the student edition: this setting is the answer to '
                    f'<a href="#{html.escape(label)}">the exercise</a> below. Choose it in your notebook after you '
                    f"have checked your answer.</em></p>")
            return m.group(1) + note + m.group(5)

        new = VIEW.sub(sub, text)
        if new != text:
            raw.replace_self(nodes.raw("", new, format=raw.get("format", "html")))
    return count


def _withhold_answers(app, doctree):
    """Student edition: withhold the outputs that answer an exercise (see the module docstring)."""
    if not app.config.memlab_student:
        return
    from docutils import nodes

    for cell in list(doctree.findall(nodes.container)):
        if cell.get("nb_element") != "cell_code":
            continue
        if "colab-setup" in (cell.get("cell_metadata") or {}).get("tags", []):
            # it installs the package from the repository, whose address the student pages do not give
            cell.parent.remove(cell)
            continue
        meta = (cell.get("cell_metadata") or {}).get("memlab") or {}
        label = meta.get("reveals") if isinstance(meta, dict) else None
        if not label:
            continue
        if meta.get("points"):
            if not _withhold_points(cell, meta["points"], label):
                raise ValueError(f"{app.env.docname}: no explorer view at {meta['points']} to withhold for {label}")
            continue
        for out in [c for c in cell.children if isinstance(c, nodes.container) and c.get("nb_element") == "cell_code_output"]:
            cell.remove(out)
        for key in ("hide_mode", "prompt_show", "prompt_hide"):
            if key in cell.attributes:
                del cell.attributes[key]
        text = nodes.emphasis()
        text += nodes.Text("Withheld in the student edition: this output is the answer to ")
        text += nodes.reference("", "the exercise", refid=label, internal=True)
        text += nodes.Text(". Run the cell in your notebook after you have checked your answer.")
        cell += nodes.paragraph("", "", text, classes=["memlab-withheld"])


def _build_finished(app, exception):
    # sphinx-book-theme copies each executed notebook (solutions included) into _sources/
    # for its download button, whatever html_copy_source says: the student edition has none.
    if exception is None and app.config.memlab_student:
        shutil.rmtree(Path(app.outdir) / "_sources", ignore_errors=True)


def setup(app):
    app.add_config_value("memlab_student", False, "html")
    app.connect("config-inited", _config_inited, priority=900)
    app.connect("html-page-context", _page_context, priority=999)
    app.connect("build-finished", _build_finished)
    app.connect("doctree-read", _withhold_answers)
    app.add_js_file("memlab.js", defer="defer")
    app.add_css_file("memlab.css")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
