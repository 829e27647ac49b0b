"""The book builds with warnings as errors, and its pages show recorded results with provenance."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def built(built_book):
    """The book's HTML pages, from the run's one build (conftest.built_book)."""
    return built_book / "html"


@pytest.mark.slow
def test_every_page_is_built(built):
    for page in ["intro", "measuring", "ch1_caching_allocator", "ch2_cross_stream", "ch3_pinned_memory",
                 "ch4_hidden_syncs", "claims", "instructors"]:
        assert (built / "book" / f"{page}.html").exists(), page
    assert (built / "index.html").exists()


@pytest.mark.slow
@pytest.mark.parametrize("page", ["intro", "measuring", "ch1_caching_allocator", "ch2_cross_stream",
                                  "ch3_pinned_memory", "ch4_hidden_syncs"])
def test_pages_show_recorded_figures_with_provenance(built, page):
    html = (built / "book" / f"{page}.html").read_text()
    assert "Recorded mode" in html
    assert re.search(r'<img[^>]+src="\.\./_images/(?:memlab/)?[0-9a-f]+\.png"', html), "no figure made by the page's code"
    assert "Traceback" not in html


@pytest.mark.slow
def test_colab_launch_button_points_at_the_notebook(built):
    import yaml

    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]
    repo = url.removeprefix("https://github.com/")
    html = (built / "book" / "ch1_caching_allocator.html").read_text()
    assert f"https://colab.research.google.com/github/{repo}/blob/main/book/ch1_caching_allocator.ipynb" in html


@pytest.mark.slow
def test_instructors_page_has_the_generated_exercise_table(built):
    import html as html_mod

    from experiments.grading.notebooks import exercises

    page = html_mod.unescape((built / "book" / "instructors.html").read_text())
    text = re.sub(r"<[^>]+>", "", page).replace("\u2019", "'")  # Sphinx's smart quotes
    for e in exercises().values():
        assert e.objective in text, e.label
        assert f"{e.check.__module__.split('.')[1]}.{e.check_name}" in text
    assert "Grading a class" in text and "python -m experiments grade" in text
