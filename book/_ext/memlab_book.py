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
- Gives every page a favicon (``book/_static/favicon.svg``): without one, browsers ask for
  ``/favicon.ico`` and get a 404 on every page.
- Ships only the icon glyphs the pages use: the theme's ``<i class="fa-...">`` icons
  are drawn as SVG by the trimmed ``fontawesome.js``, and the few drawn from Font Awesome's
  webfont by CSS (admonition titles, the theme's ``--pst-icon-*``) come from a subset of its
  solid font (:func:`icon_codepoints`, :func:`subset_icon_font`), so that the 275 kB of
  webfonts are never fetched.
- No answer before it is asked for: in the full book, a cell marked ``memlab: {reveals: <label>}`` gets the
  class ``memlab-answer`` (and ``memlab-answer-to-<label>``), and the explorer views at its
  ``points`` the attribute ``data-answer-to``, their images not loaded: ``memlab-figures.js``
  shows them only once the exercise's solution or answer has been opened, and ``memlab.js``
  keeps solutions and answers out of search result snippets. The page's ``.ipynb`` download is
  the notebook Colab opens (``book/<page>.ipynb``: plain Markdown, solutions folded), not the
  executed MyST notebook with solutions as open text, and notebook pages offer no download of
  their MyST source, which holds the solutions as text too.
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
    if not config.html_favicon:
        # an absolute path: the student edition's config is read from another folder
        config.html_favicon = str(STATIC / "favicon.svg")


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
    else:
        for group in context.get("header_buttons", []):
            buttons = group.get("buttons") if isinstance(group, dict) else None
            labels = {b.get("label") for b in buttons or [] if isinstance(b, dict)}
            if "download-notebook-button" in labels:
                # the page's MyST source holds the solutions as open text; its notebook is Colab's
                group["buttons"] = [b for b in buttons if b.get("label") != "download-source-button"]


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


def _mark_points(node, specs: list, label: str) -> int:
    """Full book: mark the explorer views at ``specs`` under ``node`` as ``label``'s answer, their
    images not loaded until ``memlab-figures.js`` shows them; returns how many."""
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
            body = m.group("body").replace(' srcset="data:', ' data-srcset="data:').replace(' src="data:', ' data-src="data:')
            return m.group(1)[:-1] + f' data-answer-to="{html.escape(label)}">' + body + m.group(5)

        new = VIEW.sub(sub, text)
        if new != text:
            raw.replace_self(nodes.raw("", new, format=raw.get("format", "html")))
    return count


def _mark_answers(app, doctree):
    """Full book: mark the outputs that answer an exercise (see the module docstring)."""
    from docutils import nodes

    for cell in list(doctree.findall(nodes.container)):
        if cell.get("nb_element") != "cell_code":
            continue
        meta = (cell.get("cell_metadata") or {}).get("memlab") or {}
        label = meta.get("reveals") if isinstance(meta, dict) else None
        if not label:
            continue
        if meta.get("points"):
            if not _mark_points(cell, meta["points"], label):
                raise ValueError(f"{app.env.docname}: no explorer view at {meta['points']} to mark for {label}")
            continue
        cell["classes"] += ["memlab-answer", f"memlab-answer-to-{label}"]


def _withhold_answers(app, doctree):
    """Student edition: withhold the outputs that answer an exercise (see the module docstring)."""
    if not app.config.memlab_student:
        _mark_answers(app, doctree)
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


# A private-use character (Font Awesome's glyphs) in a CSS string, as a character or an escape.
_PUA = r'(?:[\ue000-\uf8ff]|\\f[0-9a-fA-F]{3})'


def icon_codepoints(theme_css: str, other_css: list[str]) -> set[int]:
    """The Font Awesome glyphs the theme's CSS draws with the webfont: the values of
    pydata-sphinx-theme's ``--pst-icon-*`` properties (admonition titles, external links,
    breadcrumbs) and every glyph another stylesheet puts in a ``content``. The Font Awesome
    bundle's own ``.fa-*:before`` rules are left out: the trimmed ``fontawesome.js`` draws
    those icons as SVG."""
    def cp(text: str) -> int:
        return ord(text) if len(text) == 1 else int(text[1:], 16)

    found = {cp(m) for m in re.findall(r'--pst-icon-[\w-]+:\s*"(' + _PUA + ')"', theme_css)}
    for css in other_css:
        found |= {cp(m) for m in re.findall(r'content:\s*"(' + _PUA + ')"', css)}
    return found


def subset_icon_font(ttf: Path, codepoints: set[int], out: Path) -> int:
    """Write ``ttf`` cut down to ``codepoints`` as a WOFF file (fontTools; zlib, as brotli for
    WOFF2 is not installed). Returns the glyphs kept."""
    from fontTools import subset
    from fontTools.ttLib import TTFont

    options = subset.Options()
    options.flavor = "woff"
    options.layout_features = []
    options.name_IDs = ["*"]
    font = TTFont(str(ttf))
    sub = subset.Subsetter(options)
    sub.populate(unicodes=sorted(codepoints))
    sub.subset(font)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    subset.save_font(font, str(tmp), options)
    os.replace(tmp, out)
    return len(font.getGlyphOrder())


_FONT_FACE = re.compile(r"@font-face\{[^}]*\}")


def _subset_theme_font(outdir: Path) -> None:
    """Point the theme's solid Font Awesome face at a subset of the glyphs the CSS uses, and drop
    the brands and regular faces, which no CSS rule uses (their icons are SVG)."""
    static = outdir / "_static"
    theme = static / "styles" / "pydata-sphinx-theme.css"
    fonts = static / "vendor" / "fontawesome" / "webfonts"
    if not theme.exists() or not (fonts / "fa-solid-900.ttf").exists():
        return
    text = theme.read_text()
    others = [p.read_text(errors="replace") for p in static.rglob("*.css") if p != theme]
    cps = icon_codepoints(text, others)
    if not cps:
        return
    name = "fa-solid-900-used.woff"
    subset_icon_font(fonts / "fa-solid-900.ttf", cps, fonts / name)

    def face(m: re.Match) -> str:
        rule = m.group(0)
        if "Font Awesome" not in rule:
            return rule
        if "fa-solid-900" in rule:
            return re.sub(r"src:[^;}]*", f'src:url(../vendor/fontawesome/webfonts/{name}) format("woff")', rule)
        return ""  # brands, regular: no CSS rule draws with them

    new = _FONT_FACE.sub(face, text)
    if new != text:
        tmp = theme.with_name(f".{theme.name}.tmp")
        tmp.write_text(new)
        os.replace(tmp, theme)
    # the webfonts nothing names any more are not shipped (1.1 MB)
    texts = [p.read_text(errors="replace") for p in outdir.rglob("*") if p.suffix in (".css", ".js", ".html")]
    for font in fonts.iterdir():
        if font.name != name and not any(font.name in t for t in texts):
            font.unlink()


def _colab_notebooks_for_download(outdir: Path, srcdir: Path) -> None:
    """The page's ".ipynb" download is the notebook Colab opens (book/<page>.ipynb), in place of
    the executed MyST notebook sphinx-book-theme copied to _sources/ (solutions as open text)."""
    for path in (outdir / "_sources").rglob("*.ipynb"):
        colab = srcdir / path.relative_to(outdir / "_sources")
        if colab.exists():
            tmp = path.with_name(f".{path.name}.tmp")
            shutil.copyfile(colab, tmp)
            os.replace(tmp, path)


def _build_finished(app, exception):
    # sphinx-book-theme copies each executed notebook (solutions included) into _sources/
    # for its download button, whatever html_copy_source says: the student edition has none.
    if exception is None and app.config.memlab_student:
        shutil.rmtree(Path(app.outdir) / "_sources", ignore_errors=True)
    elif exception is None and app.builder.format == "html":
        _colab_notebooks_for_download(Path(app.outdir), Path(app.srcdir))
    if exception is None and app.builder.format == "html":
        _trim_theme_icons(Path(app.outdir))
        _subset_theme_font(Path(app.outdir))


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
