"""The student edition holds no solution anywhere: pages, page sources, search index, notebooks.

Every solution's text is taken from the MyST sources (book/src/*.py). The same probes are
first found in the full book (so the crawl can fail), then looked for in every file of the
student site and in the notebooks `make book-student` hands out.
"""
from __future__ import annotations

import html
import json
import re
from html.parser import HTMLParser

import pytest

from .booktools import ROOT

pytestmark = pytest.mark.slow

SOLUTION = re.compile(r"^(`{3,}|:{3,})\{solution\}.*?\n(.*?)^\1\s*$", re.M | re.S)


def _plain(text: str) -> str:
    """Text without Markdown/HTML markup, whitespace collapsed: what a reader would read."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.translate(str.maketrans({"\u2019": "'", "\u2018": "'", "\u201c": '"', "\u201d": '"', "\u2212": "-"}))
    text = re.sub(r"[*`_\\|>#]", " ", html.unescape(text))
    text = re.sub(r"\{\w+\}", " ", text)   # MyST roles ({ref}) render as their target's text
    text = re.sub(r"\s+([.,:;)!?])", r"\1", re.sub(r"([(])\s+", r"\1", text))
    return re.sub(r"\s+", " ", text).strip()


def _sources(kind: str = "markdown") -> dict[str, str]:
    import jupytext

    out = {}
    for src in sorted((ROOT / "book" / "src").glob("*.py")):
        cells = jupytext.read(src).cells
        out[src.stem] = "\n".join(c.source for c in cells if c.cell_type == kind)
    return out


def solution_probes() -> list[str]:
    """Lines of every solution (markup stripped, 40+ characters), none of them also outside solutions."""
    sources = _sources()
    # Text the pages show outside solutions too (a solution may repeat an exercise's code).
    outside = _plain(" ".join(SOLUTION.sub("", t) for t in sources.values()) + " "
                     + " ".join(_sources("code").values()))
    probes = []
    for text in sources.values():
        for m in SOLUTION.finditer(text):
            for line in m.group(2).splitlines():
                if line.startswith(":") or line.startswith("```"):
                    continue
                p = _plain(line)
                if len(p) >= 40 and p not in outside:
                    probes.append(p)
    return probes


def solution_words() -> set[str]:
    """Words (stemmed as Sphinx's search index stems them) used only inside solutions."""
    from sphinx.search.en import SearchEnglish

    stem = SearchEnglish({}).stem
    sources = _sources()

    def words(t):
        return {w.lower() for w in re.findall(r"[A-Za-z]{5,}", t)}

    inside = set().union(*(words(re.sub(r"^:\w+:.*$", "", m.group(2), flags=re.M))
                           for t in sources.values() for m in SOLUTION.finditer(t)))
    # Everything else a page shows: its prose, its code, the instructors page.
    elsewhere = set().union(*(words(SOLUTION.sub("", t)) for t in sources.values()))
    for src in (ROOT / "book" / "src").glob("*.py"):
        import jupytext

        elsewhere |= words(" ".join(c.source for c in jupytext.read(src).cells if c.cell_type == "code"))
    elsewhere |= words((ROOT / "book" / "instructors.md").read_text())
    stems_elsewhere = {stem(w) for w in elsewhere}
    return {stem(w) for w in inside - elsewhere} - stems_elsewhere


class _Text(HTMLParser):
    def __init__(self):
        super().__init__()
        self.parts = []

    def handle_data(self, data):
        self.parts.append(data)


def _file_text(path) -> str:
    raw = path.read_text(errors="replace")
    if path.suffix == ".html":
        t = _Text()
        t.feed(raw)
        raw = "".join(t.parts)
    elif path.suffix == ".ipynb":
        raw = " ".join("".join(c.get("source", "")) if isinstance(c.get("source"), list) else c.get("source", "")
                       for c in json.loads(raw).get("cells", []))
    return _plain(raw)


def _crawl(root) -> dict[str, str]:
    return {str(p.relative_to(root)): _file_text(p) for p in root.rglob("*")
            if p.is_file() and p.suffix in (".html", ".txt", ".ipynb", ".md", ".js", ".json", ".py")}


def _index_terms(root) -> set[str]:
    text = (root / "searchindex.js").read_text()
    data = json.loads(text[text.index("(") + 1:text.rindex(")")])
    return set(data["terms"]) | set(data.get("titleterms", {}))


@pytest.fixture(scope="module")
def student_build(built_book, tmp_path_factory):
    """Everything `make book-student` writes (pages, handed-out notebooks, the package's wheel),
    built with the full book's execution cache (no second execution)."""
    import importlib.util
    import subprocess
    import sys

    subprocess.run([sys.executable, str(ROOT / "scripts" / "sync_notebooks.py")], check=True, cwd=ROOT,
                   capture_output=True)
    spec = importlib.util.spec_from_file_location("student_edition", ROOT / "scripts" / "student_edition.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.build(tmp_path_factory.mktemp("student") / "student", cache=built_book / ".jupyter_cache")


@pytest.fixture(scope="module")
def student_site(student_build):
    return student_build / "_build" / "html"


def test_solution_probes_are_found_in_the_full_book(site):
    probes = solution_probes()
    assert len(probes) >= 40, probes
    pages = " ".join(_crawl(site["dir"] / "book").values())
    found = [p for p in probes if p in pages]
    # The full book renders every solution; a few lines render differently (math, tables).
    assert len(found) >= 0.9 * len(probes), [p for p in probes if p not in pages][:10]
    assert solution_words() & _index_terms(site["dir"]), "the full book's search index has no solution word"


def test_student_site_has_no_solution_anywhere(student_site):
    probes = solution_probes()
    leaks = [(name, p[:60]) for name, text in _crawl(student_site).items() for p in probes if p in text]
    assert not leaks, f"{len(leaks)} solution lines in the student site: {leaks[:10]}"
    assert not (student_site / "_sources").exists(), "the student site copies its page sources (with solutions)"
    from sphinx.search.en import SearchEnglish

    stem = SearchEnglish({}).stem
    shown = {stem(w.lower()) for page in (student_site / "book").glob("*.html")
             for w in re.findall(r"[A-Za-z]{2,}", _file_text(page))}
    words = (solution_words() & _index_terms(student_site)) - shown
    assert not words, f"the student search index holds words only solutions use: {sorted(words)[:20]}"
    for page in (student_site / "book").glob("*.html"):
        text = page.read_text()
        assert "Download this page" not in text and 'download' not in re.findall(r'title="([^"]*)"', text), page.name


def test_handed_out_notebooks_have_no_solution(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("student_edition", ROOT / "scripts" / "student_edition.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    written = mod.write_notebooks(tmp_path)
    probes = solution_probes()
    full = " ".join(_file_text(p) for p in (ROOT / "book").glob("*.ipynb"))
    assert sum(p in full for p in probes) >= 0.9 * len(probes), "the probes do not match the repository's notebooks"
    leaks = [(p.name, s[:60]) for p in written for s in probes if s in _file_text(p)]
    assert not leaks, leaks[:10]


# ----------------------------------------------------------------------------- answers outside solutions (issue 16)

def _reveals() -> dict[str, list[dict]]:
    """{page: [the `memlab` metadata of each cell marked as revealing an answer]} from book/src."""
    import jupytext

    out = {}
    for src in sorted((ROOT / "book" / "src").glob("*.py")):
        marked = [c.metadata["memlab"] for c in jupytext.read(src).cells if c.metadata.get("memlab", {}).get("reveals")]
        if marked:
            out[src.stem] = marked
    return out


VIEW = re.compile(r'<figure class="memlab-view" data-point="([^"]*)"[^>]*>(.*?)</figure>', re.S)


def _views(page_html: str) -> list[tuple[dict, str]]:
    return [(json.loads(html.unescape(p)), body) for p, body in VIEW.findall(page_html)]


def _answer_views(page: str, site) -> list[str]:
    """The bodies of the explorer views that are an exercise's answer, on one page of a site."""
    text = (site / "book" / f"{page}.html").read_text()
    specs = [spec for meta in _reveals().get(page, []) for spec in meta.get("points", [])]
    return [body for point, body in _views(text) if any(all(point.get(k) == v for k, v in s.items()) for s in specs)]


def test_answers_in_folds_and_explorer_points_are_in_the_full_book(site):
    """The probes below can fail: the full book shows every output that answers an exercise."""
    reveals = _reveals()
    assert {"ch1_caching_allocator", "ch2_cross_stream"} <= set(reveals)
    for page in reveals:
        text = (site["dir"] / "book" / f"{page}.html").read_text()
        assert "Withheld in the student edition" not in text
    assert "Show the answer" in (site["dir"] / "book" / "ch1_caching_allocator.html").read_text()
    bodies = _answer_views("ch1_caching_allocator", site["dir"])
    assert bodies and all("<img" in b for b in bodies)


def test_student_pages_withhold_every_output_that_answers_an_exercise(student_site):
    for page, marked in _reveals().items():
        text = (student_site / "book" / f"{page}.html").read_text()
        whole = [m for m in marked if not m.get("points")]
        assert text.count("this output is the answer to") == len(whole), page
        for m in marked:
            assert f'href="#{m["reveals"]}"' in text, (page, m)
        bodies = _answer_views(page, student_site)
        assert bool(bodies) == any(m.get("points") for m in marked), page
        for body in bodies:
            assert "<img" not in body and "Withheld in the student edition" in body, (page, body[:200])
    for page in (student_site / "book").glob("*.html"):
        assert "Show the answer" not in page.read_text(), f"{page.name}: an answer fold"


def test_student_site_has_no_way_to_the_full_book_or_the_repository(student_site):
    import yaml

    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"].rstrip("/")
    org, repo = url.removesuffix(".git").split("/")[-2:]
    full = (f"github.com/{org}/{repo}", f"{org}.github.io/{repo}")
    for page in student_site.rglob("*.html"):
        text = page.read_text()
        hrefs = re.findall(r'href="([^"]*)"', text)
        assert not [h for h in hrefs if any(f in h for f in full)], (page.name, [h for h in hrefs if any(f in h for f in full)])
        assert not any(f in text for f in full), f"{page.name} names the repository or the full book"
        assert "Source repository" not in text and "Open an issue" not in text, page.name


# ----------------------------------------------------------------------------- the whole student folder (issue 27)

def _all_text(path) -> str:
    """What a file holds as text a reader could find: pages and notebooks as text, a wheel or a
    zip through its members, anything else decoded as it is."""
    import zipfile

    if path.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(path) as z:
            return " ".join(_plain(z.read(n).decode("utf-8", "replace")) for n in z.namelist())
    if path.suffix in (".html", ".ipynb"):
        try:
            return _file_text(path)
        except ValueError:
            pass
    return _plain(path.read_bytes().decode("utf-8", "replace"))


def _pyodide_release_copies(files) -> set:
    """Those of ``files`` that are byte for byte a file the doctor's page ships from the pinned
    Pyodide release as it came (book/_ext/doctor_page.py: PYODIDE_FILES of NODE_PYODIDE, from the
    npm registry), which nothing of ours wrote into (over half of the student folder's bytes)."""
    import hashlib
    import sys

    ext = str(ROOT / "book" / "_ext")
    if ext not in sys.path:
        sys.path.insert(0, ext)
    import doctor_page

    release = [doctor_page.NODE_PYODIDE / f for f in doctor_page.PYODIDE_FILES]
    if not all(f.is_file() for f in release):
        return set()

    def key(f):
        return f.stat().st_size, hashlib.sha256(f.read_bytes()).digest()

    shipped = {key(f) for f in release}
    sizes = {size for size, _ in shipped}
    return {p for p in files if p.stat().st_size in sizes and key(p) in shipped}


def test_nothing_under_the_student_build_holds_a_solution(student_build):
    """Issue 27: _build/student/_build/jupyter_execute/ held every solution beside the clean
    pages and notebooks: zipping _build/student handed them out. Every file under the student
    folder, whatever its kind (pages, notebooks, caches, the wheel), is searched, but for the
    files of the Pyodide release, byte for byte as npm delivered them."""
    probes = solution_probes()
    every = [p for p in student_build.rglob("*") if p.is_file()]
    release = _pyodide_release_copies(every)
    files = [p for p in every if p not in release]
    assert any(p.suffix == ".html" for p in files) and any(p.suffix == ".ipynb" for p in files)
    # What an open book cannot hide: a solution line that is the package's own reference code
    # (the fragmentation index, which the checks and the doctor compute) may be in the package
    # itself (its wheel, the doctor's bundle for the browser), nowhere else.
    package = " ".join(_plain(p.read_text()) for p in (ROOT / "experiments").rglob("*.py"))
    open_book = {s for s in probes if s in package}
    assert len(open_book) < 0.05 * len(probes), open_book
    texts = {str(p.relative_to(student_build)): _all_text(p) for p in files}
    leaks = [(name, s[:60]) for name, text in texts.items() for s in probes
             if s in text and not (name.endswith((".whl", ".zip")) and s in open_book)]
    assert not leaks, f"{len(leaks)} solution lines under the student folder: {leaks[:10]}"
    assert any(p.suffix == ".whl" for p in files), "no wheel of the package to hand out"


def test_the_instructors_page_is_only_in_the_full_book(site, student_site):
    """Issue 27: the instructors' page (grading, the sandbox, what the checks recompute) was
    built and linked in the student edition."""
    assert (site["dir"] / "book" / "instructors.html").exists()
    assert not list(student_site.rglob("instructors*")), list(student_site.rglob("instructors*"))
    for page in student_site.rglob("*.html"):
        assert "instructors.html" not in page.read_text(), page.name
