"""The book's Sphinx extension (book/_ext/memlab_book.py), without a build: inline figures
become image files, and the theme's icon bundle keeps only the icons the pages name."""
from __future__ import annotations

import base64
import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

from .booktools import ROOT


@pytest.fixture(scope="module")
def ext():
    spec = importlib.util.spec_from_file_location("memlab_book", ROOT / "book" / "_ext" / "memlab_book.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _png(color: int) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4, 3), (color, 0, 0)).save(buf, format="PNG")
    return buf.getvalue()


def test_inline_pngs_become_files_named_by_their_content(ext, tmp_path):
    a, b = (base64.b64encode(_png(c)).decode() for c in (10, 200))
    body = (f'<picture><source media="(max-width: 719.98px)" srcset="data:image/png;base64,{b}">'
            f'<img src="data:image/png;base64,{a}" alt="x"></picture>'
            f'<figure hidden><img data-src="data:image/png;base64,{a}"></figure>'
            f'<source data-srcset="data:image/png;base64,{b}">')
    out = ext.images_to_files(body, tmp_path / "memlab", lambda name: f"../_images/memlab/{name}")
    assert "data:image" not in out
    files = sorted(p.name for p in (tmp_path / "memlab").iterdir())
    assert len(files) == 2  # the same figure twice is one file, which the browser caches
    for attr in ("srcset", 'img src', "data-src", "data-srcset"):
        assert f'{attr}="../_images/memlab/' in out
    assert {(tmp_path / "memlab" / f).read_bytes() for f in files} == {_png(10), _png(200)}
    assert not list((tmp_path / "memlab").glob(".*"))  # no temporary file left behind



def _theme_fontawesome() -> Path:
    import pydata_sphinx_theme

    path = Path(pydata_sphinx_theme.__file__).parent / "theme" / "pydata_sphinx_theme" / "static" / "scripts" / \
        "fontawesome.js"
    assert path.exists(), "pydata-sphinx-theme no longer ships scripts/fontawesome.js: see memlab_book._trim_theme_icons"
    return path


def test_the_icon_bundle_keeps_the_icons_the_pages_name_and_nothing_else(ext):
    js = _theme_fontawesome().read_text()
    used = ext.icons_used(['<i class="fa-solid fa-bars"></i> <i class="fa-brands fa-github">', 'x("fa-xmark")'])
    assert {"bars", "github", "xmark"} <= used
    out, kept, dropped = ext.trim_fontawesome(js, used)
    assert len(out) < len(js) / 10 and dropped > 1000
    kept_names = {m.group(1).strip('"') for m in ext._FA_ICON.finditer(out)}
    assert {"bars", "github", "xmark"} <= kept_names and "rocket" not in kept_names
    assert kept == len(list(ext._FA_ICON.finditer(out)))
    assert ext.trim_fontawesome(out, used)[0] == out  # nothing more to drop
    assert "___FONT_AWESOME___" in out  # the library itself stays
    node = shutil.which("node")
    if node:  # the trimmed bundle is still a valid script (the browser tests run it in the pages)
        r = subprocess.run([node, "--check", "-"], input=out, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
