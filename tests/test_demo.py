"""The main job: ``python -m vllm_rocm_aiter_plugin`` on the installed vLLM, in a fresh process."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests import environment, vllm_releases
from tests.subprocess_util import REPO_ROOT, scrubbed_env

pytestmark = [pytest.mark.cpu, pytest.mark.subprocess]

LOG_LINE = re.compile(r"^(DEBUG|INFO|WARNING|ERROR) \d\d-\d\d ", re.M)


def _demo(env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vllm_rocm_aiter_plugin"],
        cwd=REPO_ROOT, env=scrubbed_env(env_extra), capture_output=True, text=True, timeout=600,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _section(out: str, title: str) -> str:
    start = out.index(title)
    end = out.find("\n\n", start)
    return out[start : end if end >= 0 else None]


def test_demo_shows_both_bugs_and_whether_the_fix_is_active(tmp_path):
    """Active (exit 0) wherever the plugin takes ROCM_AITER_FA by default; on a vLLM older than
    the tested range the policy leaves it stock, and the demo says so (exit 1). It leaves none
    of its model directories behind."""
    proc = _demo({"TMPDIR": str(tmp_path)})
    assert not list(tmp_path.glob("tiny-llama-*"))
    active = environment.plugin_overrides_by_default()
    assert proc.returncode == (0 if active else 1), proc.stdout + proc.stderr
    out = proc.stdout
    # stdout is the demo's own report: vLLM's log lines are summarised on stderr afterwards
    assert not LOG_LINE.search(out), out
    assert "vLLM's log while the demo ran" in proc.stderr

    eagle = _section(out, "1. EAGLE pure-decode batch")
    affected = vllm_releases.installed_is_affected()
    assert ("raises AssertionError" in eagle) is affected
    assert "registered builder             decodes 4, extends 0, prefills 0" in eagle

    v2 = _section(out, "2. Model-runner V2 step")
    drops = vllm_releases.installed_drops_context_in_v2_order()
    assert ("ignores 8192 cached tokens" in v2) is drops
    stock_counts = "vLLM's builder                 decodes 1, extends 0, prefills 2"
    assert (stock_counts in v2) is drops
    plugin_counts = "registered builder             decodes 1, extends 2, prefills 0"
    assert (plugin_counts in v2) is active

    table = _section(out, "   Attention output")
    rows = {line.split()[0]: line for line in table.splitlines()[2:] if line.startswith("   ")}
    assert set(rows) >= {"decode", "new-prompt", "continuation"}
    assert ("WRONG" in rows["continuation"].split("extend")[0]) is drops  # stock's column
    if active:
        assert not rows["continuation"].rstrip().endswith("WRONG")  # the plugin's column
        assert "fix ACTIVE" in out
    else:
        assert "(NOT the plugin)" in out and "fix NOT active" in out


def test_demo_fails_when_the_plugin_is_disabled():
    proc = _demo({"VLLM_ROCM_AITER_PLUGIN": "0"})
    assert proc.returncode == 1
    assert "NOT the plugin" in proc.stdout and "fix NOT active" in proc.stdout
