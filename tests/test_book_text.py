"""What the book and README say about where things ran: only what was measured."""
import re

import yaml

from .booktools import ROOT


def test_instructors_page_names_the_measured_setup_and_no_unmeasured_gpu():
    text = (ROOT / "book" / "instructors.md").read_text()
    # The recorded files say where every result was measured (experiments/recorded/*/*.json).
    assert "H200" in text and "torch 2.11.0+cu130" in text
    assert not re.search(r"runs on (a )?free Colab T4", text)
    assert "python -m experiments probe" in text and "scripts/gpu_probe.py" not in text


def test_readme_gives_the_online_address_and_a_real_pip_url():
    readme = (ROOT / "README.md").read_text()
    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]
    org, repo = url.removeprefix("https://github.com/").split("/")[:2]
    assert f"https://{org}.github.io/{repo}/" in readme
    assert f"git+{url}" in readme and "<this repository" not in readme
