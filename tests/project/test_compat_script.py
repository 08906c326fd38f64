"""``scripts/compat.py --rerun-failed``: which tests it reruns, and how the table shows a rerun."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.helpers.subprocess_util import REPO_ROOT

pytestmark = pytest.mark.novllm

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4" failures="1" errors="1" skipped="1">
<testcase classname="tests.commands.test_doctor" name="test_disabled_plugin[kill-switch]">
  <failure message="assert 2 == 1">...</failure></testcase>
<testcase classname="tests.commands.test_doctor" name="test_passes"/>
<testcase classname="tests.unit.test_builder.TestSomething" name="test_method">
  <error message="boom">...</error></testcase>
<testcase classname="tests.unit.test_split" name="test_skipped"><skipped message="why"/></testcase>
</testsuite></testsuites>
"""


def _scripts(code: str) -> object:
    """Run ``code`` with ``scripts/`` importable, as the scripts run; the JSON it prints."""
    prelude = "import json, sys\nsys.path.insert(0, 'scripts')\n"
    proc = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_rerun_takes_the_failed_and_errored_tests_as_pytest_ids(tmp_path):
    report = tmp_path / "junit.xml"
    report.write_text(REPORT)
    ids = _scripts(f"import compat\nprint(json.dumps(compat.failed_tests({str(report)!r})))")
    assert ids == [
        "tests/commands/test_doctor.py::test_disabled_plugin[kill-switch]",
        "tests/unit/test_builder.py::TestSomething::test_method",
    ]


def test_the_table_shows_a_rerun_beside_the_first_runs_seconds():
    rows = _scripts(
        """
        import docs_tables
        row = {"seconds": 857, "rerun": {"tests": 4, "failed": 0, "seconds": 95}}
        print(json.dumps([docs_tables._seconds(row), docs_tables._seconds({"seconds": 803})]))
        """
    )
    assert rows == ["857 + 95 (rerun of 4 failed)", "803"]


def test_the_table_names_the_commit_each_row_and_rerun_ran_at():
    cells = _scripts(
        """
        import docs_tables
        rows = [{"commit": "abc1234"}, {"commit": "abc1234", "rerun": {"commit": "def5678"}}, {}]
        print(json.dumps([docs_tables._commit(row) for row in rows]))
        """
    )
    assert cells == [
        "abc1234",
        "abc1234, rerun at def5678",
        "not recorded (an earlier, smaller suite)",
    ]


def test_a_row_records_the_trees_commit():
    head = subprocess.run(
        ["git", "rev-parse", "--short=7", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    if head.returncode != 0:
        pytest.skip("not a git checkout (an sdist): compat records no commit there")
    recorded = _scripts("import compat\nprint(json.dumps(compat.commit()))")
    assert isinstance(recorded, str)
    assert recorded.split()[0] == head.stdout.strip()
