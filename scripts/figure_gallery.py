"""Every figure the book's pages draw, in both layouts, as PNG files to look at.

Runs the code cells of book/src/PAGE.py in an IPython shell the way the static book build
does (recorded mode, CUDA_MEMLAB_STATIC=1), and writes each figure it shows, static or in
an explorer, as OUT/PAGE-NNN-wide.png and OUT/PAGE-NNN-narrow.png, with OUT/report.txt:
per figure its smallest font (pt), its DPI, the CSS px that font shows at in the book's
686 px of an explorer at 1280 px (wide) and in the 336 px of an exercise box at 390 px
(narrow), and any text collisions
(:func:`experiments.core.plotting.text_collisions`).

    python scripts/figure_gallery.py OUT [PAGE ...] [--max-views N]

--max-views: draw at most N views of each explorer (default: all; the build draws all).
Exits 1 when a figure has a collision or text under 9 px as the book shows it.
"""
from __future__ import annotations

import argparse
import base64
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = {"wide": 686, "narrow": 336}  # the narrowest place for a figure at 1280 and 390 px (CSS px)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("pages", nargs="*", help="page names (default: every page with a source)")
    parser.add_argument("--max-views", type=int, default=None, help="views drawn per explorer (default: all)")
    args = parser.parse_args(argv)
    os.environ.update({"CUDA_MEMLAB_STATIC": "1", "CUDA_MEMLAB_MODE": "recorded", "MPLBACKEND": "Agg"})
    import jupytext
    from IPython.core.interactiveshell import InteractiveShell

    from experiments.core import explorer

    args.out.mkdir(parents=True, exist_ok=True)
    pages = args.pages or sorted(p.stem for p in (ROOT / "book" / "src").glob("*.py"))
    rows: list[str] = []
    bad = 0
    state = {"page": "", "n": 0, "views": 0}
    real_variant, real_build = explorer._variant, explorer.build_explorer

    def variant(fig):
        nonlocal bad
        v = real_variant(fig)
        kind = "narrow" if fig.dpi != 110 else "wide"
        if kind == "wide":
            state["n"] += 1
        name = f"{state['page']}-{state['n']:03d}-{kind}.png"
        (args.out / name).write_bytes(base64.b64decode(v["uri"].split(",", 1)[1]))
        px = v["font_pt"] * v["dpi"] / 72 * min(1.0, COLUMNS[kind] / v["width"])
        flag = " !" if px < 9 or v["collisions"] else ""
        bad += bool(flag)
        rows.append(f"{name:<40} {v['width']:>5}x{v['height']:<5} font {v['font_pt']:g} pt @ {v['dpi']:g} dpi "
                    f"-> {px:4.1f} px{flag}  {'; '.join(v['collisions'])}")
        return v

    def view_html(obj, alt=""):
        state["views"] += 1
        if args.max_views is not None and state["views"] > args.max_views:
            return "<p>not drawn</p>"
        return real_view_html(obj, alt)

    def build_explorer(*a, **k):
        state["views"] = 0
        return real_build(*a, **k)

    real_view_html = explorer.view_html
    explorer._variant, explorer.view_html, explorer.build_explorer = variant, view_html, build_explorer
    import experiments.core.widgets as widgets
    widgets.build_explorer = build_explorer

    shell = InteractiveShell.instance()
    # a kernel computes every format of a cell's value; a plain shell only text/plain
    shell.display_formatter.active_types = ["text/plain", "text/html", "image/png"]
    explorer.install_book_figures()
    os.chdir(ROOT / "book")
    for page in pages:
        state.update(page=page, n=0)
        cells = jupytext.read(ROOT / "book" / "src" / f"{page}.py").cells
        for cell in cells:
            if cell.cell_type != "code":
                continue
            result = shell.run_cell(cell.source, store_history=False)
            if not result.success:
                print(f"{page}: a cell failed: {result.error_in_exec or result.error_before_exec}", file=sys.stderr)
                return 2
        print(f"{page}: {state['n']} figures", file=sys.stderr)
    (args.out / "report.txt").write_text("\n".join(rows) + "\n")
    print("\n".join(r for r in rows if r.rstrip().endswith("!") or "!  " in r) or "no collisions, no text under 9 px")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
