"""The main job: ``python -m vllm_rocm_aiter_plugin`` on the installed vLLM, in a fresh process
started outside the checkout; each distinct run once (``tests/helpers/commands.py``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.commands.test_doctor import LOG_LINE
from tests.helpers import environment, vllm_releases
from tests.helpers.commands import DEMO, run
from tests.helpers.subprocess_util import REPO_ROOT
from vllm_rocm_aiter_plugin.diagnostics import probe
from vllm_rocm_aiter_plugin.diagnostics.model_runner import why_no_v1_order


def _section(out: str, title: str) -> str:
    start = out.index(title)
    end = out.find("\n\n", start)
    return out[start : end if end >= 0 else None]


def _rows(section: str) -> dict[str, str]:
    """The attention-output table's rows of a section, by request."""
    lines = section.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["request"])
    return {
        line.split()[0]: line
        for line in lines[header + 1 :]
        if line.startswith("   ") and not line.strip().startswith("(")
    }


def test_demo_shows_the_three_bugs_and_whether_the_fix_is_active():
    """Active (exit 0) wherever the plugin takes ROCM_AITER_FA by default; on a vLLM older than
    the tested range the policy leaves it stock, and the demo says so (exit 1). Each bug shows
    stock's result, then the plugin's, or says that it does not apply to this vLLM. It leaves
    none of its model directories behind."""
    proc = run(DEMO)
    assert proc.left_behind == ()
    active = environment.plugin_overrides_by_default()
    assert proc.returncode == (0 if active else 1), proc.stdout + proc.stderr
    out = proc.stdout
    # stdout is the demo's own report; vLLM's log lines are summarised on stderr
    assert not LOG_LINE.search(out), out

    eagle = _section(out, "1. The EAGLE crash.")
    affected = probe.probe_stock_split().affected
    assert ("raises AssertionError" in eagle) is affected
    assert ("Bug 1 does not apply to this vLLM" in eagle) is not affected
    assert (
        "the plugin                     decodes/extends/prefills = (4, 0, 0)" in eagle
    ) is active

    v2 = _section(out, "2. Cached context ignored.")
    drops = probe.probe_stock_v2_order().affected
    assert ("ignores 8192 cached tokens" in v2) is drops
    stock_counts = "vLLM's builder                 decodes/extends/prefills = (1, 0, 2)"
    assert (stock_counts in v2) is drops
    plugin_counts = "the plugin                     decodes/extends/prefills = (1, 2, 0)"
    assert (plugin_counts in v2) is active
    rows = _rows(out[out.index("   Attention output") :].split("\n\n")[0])
    assert set(rows) == {"decode", "new-prompt", "continuation"}
    assert ("WRONG" in rows["continuation"].split("extend")[0]) is drops  # stock's column

    nan = _section(out, "3. NaN from empty context chunks.")
    merge_nan = vllm_releases.merge_makes_nan_of_empty_states()
    if merge_nan is None:  # outside the table: whatever the section says, it says it consistently
        merge_nan = "Bug 3 does not apply to vLLM" not in nan
    assert ("Bug 3 does not apply to vLLM" in nan) is not merge_nan
    nan_rows = _rows(nan)
    if why_no_v1_order() is None:  # vLLM's own V1 order puts the short prompt among the extends
        assert set(nan_rows) == {"decode", "continuation-a", "continuation-b", "short-prompt",
                                 "prompt"}  # fmt: skip
        stock_cell = nan_rows["short-prompt"].split("extend")[1]
        assert ("NaN WRONG" in stock_cell) is merge_nan
    else:  # no V1 runner: the V2 step whose new prompt the plugin's split moves there, said why
        assert "no V1 model runner" in nan
        assert set(nan_rows) == {"decode", "new-prompt", "continuation-a", "continuation-b"}
        regions = [w for w in nan_rows["new-prompt"].split() if w in ("prefill", "extend")]
        assert (regions[-1] == "extend") is active  # the plugin's column
    if active:
        for row in (*rows.values(), *nan_rows.values()):  # the plugin's column
            assert not row.rstrip().endswith("WRONG") and "NaN" not in row.split("extend")[-1]
        assert "fix ACTIVE" in out
    else:
        assert "(NOT the plugin)" in out and "fix NOT active" in out
    verdict = out.rstrip().splitlines()[-1]  # the last line the command prints
    assert verdict.startswith("fix ACTIVE" if active else "fix NOT active"), verdict


def test_demo_log_holds_no_line_that_contradicts_it():
    """vLLM's INFO lines are left out; each warning a machine without a GPU driver gets is
    followed by one line that says why it appears; the plugin's own lines stay."""
    from vllm_rocm_aiter_plugin.diagnostics import vllm_log

    proc = run(DEMO)
    log = proc.stderr[proc.stderr.index(vllm_log.TITLE) :].splitlines()[1:]
    for banned in ("Triton not installed or not compatible", "0 active driver(s)",
                   "Available plugins for group"):  # fmt: skip
        assert not any(banned in line for line in log), log
    assert not LOG_LINE.search(proc.stderr), proc.stderr  # no record of vLLM's printed raw
    for i, line in enumerate(log):
        explanation = vllm_log.why(line.removeprefix("  WARNING ").split(" (x")[0])
        if line.startswith("  WARNING") and explanation:
            assert log[i + 1] == f"    why here: {explanation}"
    if environment.plugin_overrides_by_default():
        assert any(line.startswith("  INFO ROCM_AITER_FA -> ") for line in log), log


@pytest.mark.project
def test_help_and_readme_name_the_same_three_bugs():
    from pathlib import Path

    proc = subprocess.run(
        [sys.executable, "-m", "vllm_rocm_aiter_plugin", "--help"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    helptext = " ".join(proc.stdout.split())
    readme = (Path(REPO_ROOT) / "README.md").read_text()
    assert "three bugs" in helptext and "three bugs" in readme
    for words in ("EAGLE crash", "cached context", "NaN from empty context chunks"):
        assert words in helptext, (words, helptext)
        assert words.lower() in readme.lower(), words


@pytest.mark.project  # the plugin's own switch: the same on every release
def test_demo_fails_when_the_plugin_is_disabled():
    proc = run(DEMO, (("VLLM_ROCM_AITER_PLUGIN", "0"),))
    assert proc.returncode == 1
    assert "NOT the plugin" in proc.stdout and "fix NOT active" in proc.stdout
