"""The docs' result tables are generated from the results files, never edited by hand."""

from __future__ import annotations

import pytest

from tests.helpers.subprocess_util import REPO_ROOT, check_generated


@pytest.mark.novllm
def test_generated_tables_match_the_results_files():
    check_generated("scripts/docs_tables.py", timeout=120)


def test_the_coverage_matrix_is_generated_from_the_cases():
    """(Reads the forward cases: torch and the plugin's wheel.)"""
    check_generated("scripts/coverage_matrix.py")


@pytest.mark.novllm
def test_the_readme_is_for_operators_and_links_every_maintainers_page():
    from pathlib import Path

    readme = (Path(REPO_ROOT) / "README.md").read_text()
    assert len(readme.splitlines()) <= 160
    for page in ("architecture", "testing", "performance", "releases", "deviations"):
        assert f"docs/{page}.md" in readme


@pytest.mark.novllm
def test_every_time_in_the_readme_comes_from_a_record():
    """A duration in the README stands only inside a generated block (from
    ``benchmarks/results/timings.json``, with its date and machine); one typed by hand fails."""
    import re
    from pathlib import Path

    readme = (Path(REPO_ROOT) / "README.md").read_text()
    outside = re.sub(r"<!-- generated: .*?<!-- end generated -->", "", readme, flags=re.S)
    durations = re.findall(
        r"\b\d+(?:[.,\u2013-]\d+)? ?(?:s|sec|seconds|min|minutes|hours?)\b", outside
    )
    assert durations == [], durations
    assert "<!-- generated: timings -->" in readme


@pytest.mark.novllm
def test_the_timing_records_hold_no_path_of_the_machine_they_ran_on():
    """A record's command names what a reader runs: paths in the checkout relative, others as
    ``<placeholders>`` (``scripts/timed.py``)."""
    import json
    import re
    import sys
    from pathlib import Path

    records = json.loads((Path(REPO_ROOT) / "benchmarks/results/timings.json").read_text())
    assert records and not [r for r in records if re.search(r"(^|\s)/", r["command"])]
    sys.path.insert(0, str(Path(REPO_ROOT) / "scripts"))
    try:
        from timed import shown
    finally:
        sys.path.pop(0)
    assert shown(["bash", "-c", "cd /tmp/x/clone && bash scripts/nox"], "/repo") == (
        "bash -c cd <clone> && bash scripts/nox"
    )
    assert shown(["/repo/.nox/demo/bin/python", "-m", "m"], "/repo") == ".nox/demo/bin/python -m m"
