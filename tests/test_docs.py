"""The docs' result tables are generated from the results files, never edited by hand."""

from __future__ import annotations

import pytest

from tests.subprocess_util import REPO_ROOT, check_generated

pytestmark = [pytest.mark.cpu, pytest.mark.novllm]


def test_generated_tables_match_the_results_files():
    check_generated("scripts/docs_tables.py", timeout=120)


def test_the_readme_is_for_operators_and_links_every_maintainers_page():
    from pathlib import Path

    readme = (Path(REPO_ROOT) / "README.md").read_text()
    assert len(readme.splitlines()) <= 160
    for page in ("architecture", "testing", "performance", "releases", "deviations"):
        assert f"docs/{page}.md" in readme
