"""The docs' result tables are generated from the results files, never edited by hand."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.subprocess_util import REPO_ROOT

pytestmark = [pytest.mark.cpu, pytest.mark.novllm]


def test_generated_tables_match_the_results_files():
    proc = subprocess.run(
        [sys.executable, "scripts/docs_tables.py", "--check"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_readme_is_for_operators_and_links_every_maintainers_page():
    from pathlib import Path

    readme = (Path(REPO_ROOT) / "README.md").read_text()
    assert len(readme.splitlines()) <= 160
    for page in ("architecture", "testing", "performance", "releases", "deviations"):
        assert f"docs/{page}.md" in readme
