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
"""
from __future__ import annotations

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
    app.add_js_file("memlab.js", defer="defer")
    app.add_css_file("memlab.css")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
