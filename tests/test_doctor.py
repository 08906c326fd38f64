"""``vllm-rocm-aiter-plugin doctor --json`` in fresh processes: keys, verdicts and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from vllm.v1.attention.backends import utils as stock_utils
from vllm.v1.attention.backends.rocm_aiter_fa import AiterFlashAttentionMetadataBuilder

from tests import environment, vllm_releases
from tests.subprocess_util import REPO_ROOT
from vllm_rocm_aiter_plugin import builder as builder_module
from vllm_rocm_aiter_plugin import policy
from vllm_rocm_aiter_plugin.builder import PluginAiterFlashAttentionMetadataBuilder
from vllm_rocm_aiter_plugin.diagnostics import doctor, probe

pytestmark = [pytest.mark.cpu, pytest.mark.subprocess]

TOP_LEVEL_KEYS = {
    "versions", "gpu", "aiter", "aiter_env", "split", "plugins", "resolution",
    "check_errors", "policy", "problems", "notes", "verdict", "exit_code",
}  # fmt: skip


def _build_calling_split_as_attribute(
    self, common_prefix_len, common_attn_metadata, fast_build=False
):
    stock_utils.split_decodes_prefills_and_extends(
        common_attn_metadata, decode_threshold=self.reorder_batch_threshold
    )
    return AiterFlashAttentionMetadataBuilder.build(
        self, common_prefix_len, common_attn_metadata, fast_build
    )


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
    return proc.returncode, json.loads(proc.stdout)  # stdout is the JSON document, nothing else


def test_default_install_reports_fix_active():
    """On any image: releases from 0.20.0 on (newer ones with a WARNING) get the fix; on an
    older one the report carries the policy's refusal, and stock's harm decides the exit code."""
    code, report = _doctor({"VLLM_ROCM_USE_AITER": "1"})
    assert set(report) == TOP_LEVEL_KEYS
    assert report["check_errors"] == {}
    if not environment.plugin_overrides_by_default():
        harmed = vllm_releases.installed_is_affected() or (
            vllm_releases.installed_drops_context_in_v2_order()
        )
        assert code == report["exit_code"] == (1 if harmed else 0)
        assert report["resolution"]["resolves_to_plugin"] is False
        assert report["policy"]["overrides_rocm_aiter_fa"] is False
        assert report["policy"]["level"] == "WARNING"
        assert report["problems"] == [report["policy"]["message"]]
        assert "VLLM_ROCM_AITER_PLUGIN=force" in report["policy"]["message"]
        return
    assert code == report["exit_code"] == 0
    assert report["policy"]["overrides_rocm_aiter_fa"] is True
    assert report["policy"]["level"] == (
        "INFO" if environment.vllm_in_tested_range() else "WARNING"
    )
    out_of_range = [p for p in report["problems"] if "outside the tested range" in p]
    assert len(out_of_range) == (0 if environment.vllm_in_tested_range() else 1)
    assert [p for p in report["problems"] if p not in out_of_range] == []
    assert report["verdict"].startswith("fix ACTIVE")
    assert report["split"]["stock_split_affected"] is vllm_releases.installed_is_affected()
    drops = vllm_releases.installed_drops_context_in_v2_order()
    assert report["split"]["stock_split_drops_context_v2_order"] is drops
    assert report["resolution"]["resolves_to_plugin"] is True
    assert report["resolution"]["overridden_by_other"] is None
    assert report["plugins"]["general_entry_point"] and report["plugins"]["platform_entry_point"]
    assert report["versions"]["vllm"].startswith(vllm_releases.release())
    assert report["versions"]["vllm_in_tested_range"] is environment.vllm_in_tested_range()
    assert (report["gpu"] is None) is not environment.gpu_visible()
    if report["gpu"] is not None:
        assert report["gpu"]["rocm"] is environment.rocm_torch()
    assert report["aiter"]["importable"] is environment.aiter_importable()
    assert report["aiter_env"]["aiter_attention_autoselect"] is True
    assert all(case["ok"] for case in report["resolution"]["behaviour"].values())
    # Notes say what this machine cannot run; they never change the verdict.
    can_run = environment.rocm_gpu() and environment.aiter_importable()
    assert any("cannot run ROCM_AITER_FA" in note for note in report["notes"]) is not can_run


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
    if vllm_releases.installed_is_affected() or vllm_releases.installed_drops_context_in_v2_order():
        assert code == report["exit_code"] == 1
        assert report["verdict"].startswith("AFFECTED and the fix is NOT active")
        assert ("model-runner V2 steps can lose context" in report["verdict"]) is (
            vllm_releases.installed_drops_context_in_v2_order()
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


def test_vllm_plugins_entries_are_not_stripped(tmp_path):
    """vLLM splits VLLM_PLUGINS at commas without stripping: with a blank before the name it
    loads stock, and the doctor says so and why."""
    code, report = _doctor({"VLLM_PLUGINS": "foo, vllm_rocm_aiter_plugin"})
    assert report["plugins"]["allowed_by_VLLM_PLUGINS"] is False
    assert report["resolution"]["resolves_to_plugin"] is False
    assert any(
        "VLLM_PLUGINS='foo, vllm_rocm_aiter_plugin' excludes" in p for p in report["problems"]
    )
    harmed = vllm_releases.installed_drops_context_in_v2_order()
    assert code == report["exit_code"] == (1 if harmed else 0)


class _AttributeSplitBuilder(PluginAiterFlashAttentionMetadataBuilder):
    """The plugin's builder on a (hypothetical) vLLM whose build() calls the split as an
    attribute: the split cannot be rebound, so vLLM's stock split runs."""

    vllm_build = staticmethod(
        builder_module.build_with_plugin_split(_build_calling_split_as_attribute)
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.uses_own_build = False


def test_verdict_comes_from_building_batches_not_from_resolution():
    """ROCM_AITER_FA resolves to the plugin, but its builder runs stock's split: NOT active."""
    behaviour = probe.check_builder_behaviour(_AttributeSplitBuilder)
    assert behaviour["v2_order"]["ok"] is not vllm_releases.installed_drops_context_in_v2_order()
    assert behaviour["eagle_pure_decode"]["ok"] is not vllm_releases.installed_is_affected()
    resolved = {
        "path": policy.BACKEND_QUALNAME,
        "stock": "vllm.v1.attention.backends.rocm_aiter_fa.AiterFlashAttentionBackend",
        "builder": "tests._AttributeSplitBuilder",
        "behaviour": behaviour,
    }
    report = doctor.collect({"resolution": lambda: doctor.resolution_report(resolved)})
    assert report["resolution"]["resolves_to_plugin"] is True
    harmed = vllm_releases.installed_is_affected() or (
        vllm_releases.installed_drops_context_in_v2_order()
    )
    if harmed:
        assert report["exit_code"] == 1
        assert report["verdict"].startswith("fix NOT working")
        assert any("does not build right" in p for p in report["problems"])
    else:
        assert report["exit_code"] == 0


@pytest.mark.parametrize("redirect", [">&-", ">/dev/full"], ids=["closed", "full"])
def test_unwritable_stdout_exits_2_with_one_line(redirect):
    env = {
        k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS", "VLLM_ROCM_AITER_PLUGIN")
    }
    proc = subprocess.run(
        f"{sys.executable} -m vllm_rocm_aiter_plugin doctor --json {redirect}",
        shell=True, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    ours = [line for line in proc.stderr.splitlines() if line.startswith("vllm-rocm-aiter-plugin:")]
    assert len(ours) == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_help_lists_doctor_json_and_exit_codes():
    proc = _cli("--help")
    assert proc.returncode == 0
    assert "doctor --json" in proc.stdout and "exit codes:" in proc.stdout
    for code in ("0", "1", "2"):
        assert f"\n  {code}  " in proc.stdout


def test_bad_doctor_option_shows_the_doctors_usage():
    proc = _cli("doctor", "--bogus")
    assert proc.returncode == 2
    assert "usage: vllm-rocm-aiter-plugin doctor [-h] [--json]" in proc.stderr
    assert "unrecognized arguments: --bogus" in proc.stderr


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vllm_rocm_aiter_plugin", *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
