"""``vllm-rocm-aiter-plugin doctor --json`` in fresh processes: keys, verdicts and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests import vllm_releases
from tests.subprocess_util import REPO_ROOT
from vllm_rocm_aiter_plugin.diagnostics import doctor, samples

pytestmark = [pytest.mark.cpu, pytest.mark.subprocess]

TOP_LEVEL_KEYS = {
    "versions", "gpu", "aiter", "aiter_env", "split", "plugins", "resolution",
    "check_errors", "problems", "verdict", "exit_code",
}  # fmt: skip


def _stock_drops_context() -> bool:
    """Whether the installed vLLM's own split puts the continuation of the V2-order example (the
    third request, 8192 cached tokens) in its prefill region."""
    from vllm.v1.attention.backends import utils as stock_utils

    batch = samples.make_batch([1, 50, 800], [901, 50, 8992])
    num_decodes, num_extends, *_ = stock_utils.split_decodes_prefills_and_extends(batch, 1)
    return int(num_decodes) + int(num_extends) <= 2


def _doctor(env_extra: dict[str, str]) -> tuple[int, dict]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VLLM_PLUGINS", "VLLM_ROCM_AITER_PLUGIN", "VLLM_ROCM_USE_AITER")
    }
    env.update(env_extra)
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_rocm_aiter_plugin", "doctor", "--json"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    start = proc.stdout.index("{\n")
    return proc.returncode, json.loads(proc.stdout[start:])


def test_default_install_reports_fix_active():
    code, report = _doctor({"VLLM_ROCM_USE_AITER": "1"})
    assert set(report) == TOP_LEVEL_KEYS
    assert code == report["exit_code"] == 0
    assert report["check_errors"] == {} and report["problems"] == []
    assert report["verdict"].startswith("fix ACTIVE")
    assert report["split"]["stock_split_affected"] is vllm_releases.installed_is_affected()
    assert report["split"]["stock_split_drops_context_v2_order"] is _stock_drops_context()
    assert report["resolution"]["resolves_to_plugin"] is True
    assert report["resolution"]["overridden_by_other"] is None
    assert report["plugins"]["general_entry_point"] and report["plugins"]["platform_entry_point"]
    assert report["versions"]["vllm"].startswith(vllm_releases.release())
    assert report["versions"]["vllm_in_tested_range"] is True
    assert report["gpu"] is None  # the CPU tier runs without a GPU
    assert report["aiter"]["importable"] is False
    assert report["aiter_env"]["aiter_attention_autoselect"] is True


@pytest.mark.parametrize(
    "env, problem",
    [
        ({"VLLM_PLUGINS": "something_else"}, "VLLM_PLUGINS='something_else' excludes the plugin"),
        ({"VLLM_ROCM_AITER_PLUGIN": "0"}, "VLLM_ROCM_AITER_PLUGIN disables the plugin"),
    ],
    ids=["VLLM_PLUGINS", "kill-switch"],
)
def test_disabled_plugin(env, problem):
    code, report = _doctor(env)
    assert report["resolution"]["resolves_to_plugin"] is False
    assert any(p.startswith(problem) for p in report["problems"]), report["problems"]
    if vllm_releases.installed_is_affected() or _stock_drops_context():
        assert code == report["exit_code"] == 1
        assert report["verdict"].startswith("AFFECTED and the fix is NOT active")
        assert ("model-runner V2 steps can lose context" in report["verdict"]) is (
            _stock_drops_context()
        )
    else:
        assert code == report["exit_code"] == 0
        assert report["verdict"].startswith("fix not needed")


def test_a_check_that_cannot_run_gives_exit_code_2():
    def broken() -> None:
        raise OSError("no access")

    report = doctor.collect({"versions": lambda: None, "split": broken, "resolution": broken})
    assert report["exit_code"] == 2
    assert report["check_errors"] == {
        "split": "OSError: no access",
        "resolution": "OSError: no access",
    }
    assert report["verdict"] == "doctor could not run: resolution, split"
