"""The book's own Sphinx extension: offline-clean pages, the book's CSS/JS, the student edition.

- Ships ``book/_static/memlab.js`` and ``memlab.css`` (phone menus, tables, code), and
  ``memlab-figures.js`` and ``memlab-figures.css`` (explorers, figures, figure zoom).
- Loads no widget JavaScript from a CDN: the static build has no widget views
  (``experiments.core.explorer``), so myst-nb's ``nb_ipywidgets_js`` is emptied.
- Drops duplicate inline scripts (sphinx-thebe's config is added twice by the pinned
  sphinx-thebe 0.3.1, which raises "Identifier 'THEBE_JS_URL' has already been declared").
- Sets the template's ``default_mode`` so that pydata-sphinx-theme does not log
  "Got invalid theme mode" on a first visit.
- Moves the figures that cells and explorers show inline (``data:`` PNGs, see
  ``experiments.core.explorer.figure_html``) into image files under ``_images/memlab/``,
  named by their content: the browser caches them and loads each only when it is shown,
  and the page's HTML stays small.
- Trims the theme's ``fontawesome.js`` (pydata-sphinx-theme bundles every Font Awesome
  icon, 1.49 MB) to the icons the built pages and scripts name, replacing the copy in the
  output; the theme itself is untouched.
- With ``memlab_student = True`` (the student edition): no download button, whose
  notebooks carry the solutions (Jupyter Book 1 ignores ``html.use_download_button``),
  and no ``_sources/`` folder, where sphinx-book-theme copies the executed notebooks.
  Outputs that answer an exercise are withheld: a code cell whose metadata says
  ``memlab: {reveals: <exercise label>}`` (set in book/src) keeps its code and loses its
  output (a "Show the answer" fold, a measurement after a check), with a note in its place;
  with ``points: [{param: value}, ...]`` as well, only the explorer views at those points
  are withheld (an explorer above an exercise whose answer is one of its settings). The
  Colab set-up cell, which names the repository, is left out of the student pages, and so is
  a code block marked ``:class: memlab-names-repository`` (the doctor page's install line).
"""
from __future__ import annotations

import base64
import hashlib
import html
import json
import os
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
    body = context.get("body")
    if app.builder.format == "html" and body and "data:image/png;base64," in body:
        pathto = context["pathto"]
        context["body"] = images_to_files(body, Path(app.outdir) / "_images" / "memlab",
                                          lambda name: pathto(f"_images/memlab/{name}", 1))
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

    # an install line that names the repository (``:class: memlab-names-repository``), which
    # holds the full book and its solutions
    for block in list(doctree.findall(nodes.literal_block)):
        if "memlab-names-repository" in block.get("classes", []):
            block.parent.remove(block)
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


_DATA_PNG = re.compile(r'((?:data-)?src(?:set)?)="data:image/png;base64,([A-Za-z0-9+/=]+)"')


def _write_once(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` unless it is there; atomically, so that parallel writers and
    an interrupted build never leave half a file."""
    if path.exists():
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def images_to_files(body: str, folder: Path, url_of) -> str:
    """``body`` with every inline PNG (``src``, ``srcset``, ``data-src``, ``data-srcset``)
    written to ``folder`` as ``<sha256 prefix>.png`` and its attribute pointing at
    ``url_of(file name)``."""
    def move(m: re.Match) -> str:
        data = base64.b64decode(m.group(2))
        name = hashlib.sha256(data).hexdigest()[:24] + ".png"
        folder.mkdir(parents=True, exist_ok=True)
        _write_once(folder / name, data)
        return f'{m.group(1)}="{url_of(name)}"'

    return _DATA_PNG.sub(move, body)


# One icon of Font Awesome's bundle: name:[width,height,[aliases],"unicode","path" or [paths]].
_FA_ICON = re.compile(r'("[^"]+"|[A-Za-z_$][\w$]*):\[\d+,\d+,\[([^\]]*)\],"[0-9a-f]+",(?:"[^"]*"|\[[^\]]*\])\]')


def icons_used(texts) -> set[str]:
    """Font Awesome icon names (without ``fa-``) that the given HTML/JS texts mention."""
    used: set[str] = set()
    for text in texts:
        used.update(re.findall(r"\bfa-([a-z0-9]+(?:-[a-z0-9]+)*)", text))
    return used


def trim_fontawesome(js: str, used: set[str]) -> tuple[str, int, int]:
    """``js`` (Font Awesome's all.js, as the theme bundles it) without the icons whose name and
    aliases are all outside ``used``. Returns (the script, icons kept, icons dropped)."""
    drop: list[tuple[int, int]] = []
    kept = 0
    for m in _FA_ICON.finditer(js):
        names = {m.group(1).strip('"')} | set(re.findall(r'"([^"]+)"', m.group(2)))
        if names & used:
            kept += 1
            continue
        start, end = m.span()
        if js[end:end + 1] == ",":  # the entry and the comma after it ...
            end += 1
        elif js[start - 1:start] == "," and not (drop and drop[-1][1] == start):
            start -= 1  # ... or, for the object's last entry, the comma before it
        drop.append((start, end))
    out, last = [], 0
    for start, end in drop:
        out.append(js[last:start])
        last = end
    out.append(js[last:])
    return "".join(out), kept, len(drop)


def _trim_theme_icons(outdir: Path) -> None:
    js_path = outdir / "_static" / "scripts" / "fontawesome.js"
    if not js_path.exists():
        return
    texts = [p.read_text(errors="replace") for p in outdir.rglob("*.html")]
    texts += [p.read_text(errors="replace") for p in (outdir / "_static").rglob("*.js") if p != js_path]
    js, kept, dropped = trim_fontawesome(js_path.read_text(), icons_used(texts))
    if kept == 0:  # the bundle changed shape: keep it whole rather than ship no icons
        return
    tmp = js_path.with_name(".fontawesome.js.tmp")
    tmp.write_text(js)
    os.replace(tmp, js_path)


def _build_finished(app, exception):
    # sphinx-book-theme copies each executed notebook (solutions included) into _sources/
    # for its download button, whatever html_copy_source says: the student edition has none.
    if exception is None and app.config.memlab_student:
        shutil.rmtree(Path(app.outdir) / "_sources", ignore_errors=True)
    if exception is None and app.builder.format == "html":
        _trim_theme_icons(Path(app.outdir))


def setup(app):
    app.add_config_value("memlab_student", False, "html")
    app.connect("config-inited", _config_inited, priority=900)
    app.connect("html-page-context", _page_context, priority=999)
    app.connect("build-finished", _build_finished)
    app.connect("doctree-read", _withhold_answers)
    app.add_js_file("memlab.js", defer="defer")
    app.add_js_file("memlab-figures.js", defer="defer")
    app.add_css_file("memlab.css")
    app.add_css_file("memlab-figures.css")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
