"""The main job: ``python -m vllm_rocm_aiter_plugin`` on the installed vLLM, in a fresh process."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests import environment, vllm_releases
from tests.subprocess_util import REPO_ROOT

pytestmark = [pytest.mark.cpu, pytest.mark.subprocess]


def _demo(env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    import os

    env = {
        k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS", "VLLM_ROCM_AITER_PLUGIN")
    }
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "vllm_rocm_aiter_plugin"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


def test_demo_shows_whether_the_fix_is_active():
    """Active (exit 0) wherever the plugin takes ROCM_AITER_FA by default; on a vLLM older than
    the README's table the policy leaves it stock, and the demo says so (exit 1)."""
    proc = _demo()
    active = environment.plugin_overrides_by_default()
    assert proc.returncode == (0 if active else 1), proc.stdout + proc.stderr
    out = proc.stdout
    affected = vllm_releases.installed_is_affected()
    drops = vllm_releases.installed_drops_context_in_v2_order()
    assert f"stock split affected               {'YES' if affected else 'no'}" in out
    assert ("AssertionError" in out) is affected
    assert "num_decodes=4, num_extends=0, num_prefills=0, num_decode_tokens=16" in out
    # stdout is the demo's own report: vLLM's log lines go to stderr
    assert not re.search(r"^(DEBUG|INFO|WARNING|ERROR) \d\d-\d\d ", out, re.M), out
    assert "Model-runner V2 step (sorted by query length, threshold 1)" in out
    assert f"stock split drops context        {'YES' if drops else 'no'}" in out
    assert ("num_decodes=1, num_extends=0, num_prefills=2" in out) is drops  # stock: context lost
    plugin_counts = "num_decodes=1, num_extends=2, num_prefills=0, num_decode_tokens=1, "
    if active:
        assert "PluginAiterFlashAttentionBackend (plugin)" in out
        assert plugin_counts in out
        assert "fix ACTIVE" in out
    else:
        assert "(NOT the plugin)" in out and "fix NOT active" in out
        assert plugin_counts not in out


def test_demo_fails_when_the_plugin_is_disabled():
    proc = _demo({"VLLM_ROCM_AITER_PLUGIN": "0"})
    assert proc.returncode == 1
    assert "NOT the plugin" in proc.stdout and "fix NOT active" in proc.stdout
