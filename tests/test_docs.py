"""The documentation stays consistent: every relative link of the README, docs/ and notes/ points
at a file that exists, and the figures bench/chart.py draws (bench/figures.json) are the ones
docs/benchmarks.md records as current. Reads files only (no torch, no matplotlib)."""

import glob
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def test_relative_links_point_at_files_that_exist():
    pages = (
        [os.path.join(ROOT, "README.md")]
        + glob.glob(os.path.join(ROOT, "docs", "*.md"))
        + glob.glob(os.path.join(ROOT, "notes", "*.md"))
    )
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", open(page).read()):
            if "://" in target:
                continue
            if not os.path.exists(os.path.join(os.path.dirname(page), target)):
                broken.append(f"{os.path.relpath(page, ROOT)} -> {target}")
    assert broken == []


def test_chart_figures_are_the_current_figures_of_docs_benchmarks():
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        import chart
    finally:
        sys.path.pop(0)
    assert chart.check(chart.load()) == []
    assert os.path.exists(os.path.join(ROOT, "docs", "benchmarks.png"))
