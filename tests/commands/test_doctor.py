"""``vllm-rocm-aiter-plugin doctor`` end to end: fresh processes started outside the checkout, as
an operator starts them. Each distinct run happens once (``tests/helpers/commands.py``) and every
test whose assertions it can answer reads it; the verdicts, problems and table in this process
are ``tests/unit/test_doctor_verdicts.py``."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import vllm_rocm_aiter_plugin
from tests.helpers import environment, vllm_releases
from tests.helpers.commands import AITER_ON, DISABLED, DOCTOR_JSON, SERVING, run
from tests.helpers.subprocess_util import REPO_ROOT, scrubbed_env
from vllm_rocm_aiter_plugin.diagnostics import probe, vllm_log
from vllm_rocm_aiter_plugin.diagnostics.forward.cases import (
    DOCTOR_SHUFFLE_DECODE_CASE,
    DOCTOR_SINK_CASE,
    ServingConfiguration,
    doctor_steps,
)

LOG_LINE = re.compile(r"^(DEBUG|INFO|WARNING|ERROR) \d\d-\d\d ", re.M)
TOP_LEVEL_KEYS = {
    "versions", "gpu", "aiter", "variables", "split", "plugins", "resolution", "forward",
    "check_errors", "policy", "problems", "notes", "verdict", "exit_code",
}  # fmt: skip


def _steps(report: dict) -> dict[str, dict]:
    return {c["case"]: c for c in report["forward"]["report"]["cases"]}


def test_default_install_reports_fix_active():
    """On any image: releases from the oldest tested on (newer ones with a WARNING) get the fix; on an
    older one the report carries the policy's refusal, and stock's harm decides the exit code."""
    ran = run(DOCTOR_JSON, AITER_ON)
    code, report = ran.returncode, ran.json()
    assert set(report) == TOP_LEVEL_KEYS
    assert report["check_errors"] == {}
    if not environment.plugin_overrides_by_default():
        assert code == report["exit_code"] == 1  # the refusal is a PROBLEM line
        assert report["resolution"]["path"] == report["resolution"]["stock"]
        assert (report["policy"]["activate"], report["policy"]["level"]) == (False, "WARNING")
        assert report["problems"] == [report["policy"]["message"]]
        assert "VLLM_ROCM_AITER_PLUGIN=force" in report["policy"]["message"]
        return
    assert code == report["exit_code"] == 0
    assert report["policy"]["activate"] is True
    in_range = environment.vllm_in_tested_range()
    assert report["policy"]["level"] == ("INFO" if in_range else "WARNING")
    # Newer than tested: the policy's WARNING is a note (the checks ran on this vLLM); no problem.
    assert report["problems"] == []
    policy_notes = [n for n in report["notes"] if n.startswith(report["policy"]["message"])]
    assert len(policy_notes) == (0 if in_range else 1)
    assert report["verdict"].startswith("fix ACTIVE")
    assert report["split"]["eagle"]["affected"] is probe.probe_stock_split().affected
    drops = probe.probe_stock_v2_order().affected
    assert report["split"]["v2_order"]["affected"] is drops
    assert report["resolution"]["path"] == "vllm_rocm_aiter_plugin.backend." + (
        "PluginAiterFlashAttentionBackend"
    )
    assert all(case["ok"] for case in report["resolution"]["behaviour"].values())
    assert report["plugins"]["general_entry_point"] and report["plugins"]["platform_entry_point"]
    assert report["versions"]["vllm"].startswith(vllm_releases.release())
    assert report["versions"]["vllm_in_tested_range"] is in_range
    assert (report["gpu"] is None) is not environment.gpu_visible()
    assert report["gpu"] is None or report["gpu"]["is_rocm"] is environment.rocm_torch()
    assert report["aiter"]["importable"] is environment.aiter_importable()
    variables = {v["name"]: v for v in report["variables"]}
    assert variables["VLLM_ROCM_USE_AITER"]["value"] == "1"
    assert all(v["reading"]["problem"] is None for v in report["variables"])
    forward = report["forward"]
    assert forward["right"] is True, forward["detail"]
    assert bool(forward["stock_wrong"]) is drops
    # what stock's split serves without context on these steps, and the plugin counted of it
    assert forward["counted"] == forward["stock_without_context"]
    assert (forward["stock_without_context"] > 0) is drops
    first = forward["report"]["cases"][0]
    facts = forward["report"]["facts"]  # what compat records of each release
    assert set(facts) == {field.name for field in dataclasses.fields(probe.ReleaseFacts)}
    if facts["no_v1_runner"] is None:  # a release with a V1 runner to compare
        assert first["outcomes"]["registered"]["chunks"] <= first["v1_stock_chunks"]
    else:
        assert first["v1_stock_chunks"] is None
    # Where this release takes attention sinks, a step with sinks is judged too.
    assert (DOCTOR_SINK_CASE.name in _steps(report)) is probe.takes_sinks()
    assert first["configuration"]["kv_cache_dtype"] == "auto"  # the check's own, named
    assert (first["configuration"]["block_size"], first["configuration"]["head_size"]) == (16, 64)
    # Notes say what this machine cannot run; they never change the verdict.
    can_run = environment.rocm_gpu() and environment.aiter_importable()
    assert any("cannot run ROCM_AITER_FA" in note for note in report["notes"]) is not can_run


def test_the_doctor_prints_no_vllm_log_line_that_contradicts_it():
    """vLLM's records are summed up on stderr before the report (no INFO line saying Triton is
    missing beside a forward check that runs vLLM's Triton kernels); stdout holds the JSON
    document and nothing else."""
    stderr = run(DOCTOR_JSON, AITER_ON).stderr
    assert not LOG_LINE.search(stderr), stderr
    for banned in ("Triton not installed or not compatible", "0 active driver(s)"):
        assert banned not in stderr
    if "WARNING Model Runner V2 requires Triton" in stderr:
        assert f"why here: {vllm_log.why('Model Runner V2 requires Triton')}" in stderr


def test_a_disabled_plugin_and_what_the_environment_gets_wrong_are_each_a_problem():
    """The kill switch, a ``VLLM_PLUGINS`` entry with a blank before the name (vLLM does not
    strip it, so it loads stock) and an unknown backend name: each is a PROBLEM line, the fresh
    vLLM process resolves stock, and the verdict says what stock gets wrong here."""
    ran = run(DOCTOR_JSON, DISABLED)
    report = ran.json()
    assert report["resolution"]["path"] == report["resolution"]["stock"]
    variables = {v["name"]: v for v in report["variables"]}
    assert variables["VLLM_PLUGINS"]["value"] == "foo, vllm_rocm_aiter_plugin"
    assert variables["VLLM_PLUGINS"]["reading"]["meaning"] == "vLLM does not load the plugin"
    for words in (
        "VLLM_PLUGINS='foo, vllm_rocm_aiter_plugin' excludes",
        "VLLM_ROCM_AITER_PLUGIN disables the plugin",
        "VLLM_ATTENTION_BACKEND='bogus' is not an attention backend",
    ):
        assert any(words in p for p in report["problems"]), (words, report["problems"])
    assert ran.returncode == report["exit_code"] == 1  # PROBLEM lines, whatever this vLLM needs
    if probe.probe_stock_split().affected or probe.probe_stock_v2_order().affected:
        assert report["verdict"].startswith("AFFECTED and the fix is NOT active")
        assert ("model-runner V2 steps can lose context" in report["verdict"]) is (
            probe.probe_stock_v2_order().affected
        )
    else:
        assert report["verdict"].startswith("fix not needed")


@pytest.mark.project  # the options' plumbing; fp8 on each release: the forward tier's fp8 cases
def test_the_doctor_checks_the_operators_serving_configuration():
    """``--kv-cache-dtype fp8 --block-size 32 --head-size 128``: the forward check runs in that
    configuration (fp8 in this device's format, scales that are not 1) and the JSON names it."""
    if not environment.plugin_overrides_by_default():
        pytest.skip("the policy leaves this vLLM stock: the forward check judges stock")
    ran = run((*DOCTOR_JSON, *SERVING), AITER_ON)
    report = ran.json()
    assert report["check_errors"] == {}
    forward = report["forward"]
    configuration = forward["report"]["cases"][0]["configuration"]
    assert (configuration["kv_cache_dtype"], configuration["block_size"]) == ("fp8", 32)
    assert configuration["head_size"] == 128
    assert configuration["fp8_format"] == environment.fp8_format_of_forward_device()
    assert configuration["k_scale"] != 1.0 and configuration["v_scale"] != 1.0
    assert forward["right"] is True, forward["detail"]
    assert ran.returncode == report["exit_code"] == 0


def test_the_forward_check_runs_in_the_shuffle_layout_the_operator_set():
    """``VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=1``, as vLLM reads it: the forward check runs in that
    layout where the release's layout can run right; where it cannot, the check says why and
    exits 2 (read off the doctor's own steps here, without a run); where the release has no such
    layout, the variable changes nothing."""
    if not environment.plugin_overrides_by_default():
        pytest.skip("the policy leaves this vLLM stock: the forward check judges stock")
    unavailable = probe.shuffle_layout_unavailable()
    if unavailable is not None and unavailable != probe.NO_SHUFFLE_LAYOUT:
        import torch

        from vllm_rocm_aiter_plugin.diagnostics.forward import runner

        steps = doctor_steps(ServingConfiguration(kv_cache_layout="SHUFFLE"), "cpu")
        reasons = {runner.not_applicable_here(case, torch.device("cpu")) for case in steps}
        assert reasons == {unavailable}  # the doctor's check_forward raises with it: exit 2
        return
    ran = run(DOCTOR_JSON, (*AITER_ON, ("VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT", "1")))
    report = ran.json()
    assert report["check_errors"] == {}
    forward = report["forward"]
    layout = "NHD" if unavailable else "SHUFFLE"
    assert forward["report"]["cases"][0]["configuration"]["kv_cache_layout"] == layout
    assert forward["right"] is True, forward["detail"]
    steps = _steps(report)
    assert ("eagle-pure-decode-no-upper-bound" in steps) is (layout == "NHD")
    assert (DOCTOR_SHUFFLE_DECODE_CASE in steps) is (layout != "NHD")
    assert ran.returncode == report["exit_code"] == 0


def _cli(*args: str, **options) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vllm_rocm_aiter_plugin", *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        **options,
    )  # fmt: skip


@pytest.mark.project
def test_a_closed_stdout_exits_2_with_one_line():
    proc = subprocess.run(
        f"{sys.executable} -m vllm_rocm_aiter_plugin doctor --json >&-",
        shell=True, cwd=REPO_ROOT, env=scrubbed_env(), capture_output=True, text=True,
        timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    ours = [line for line in proc.stderr.splitlines() if line.startswith("vllm-rocm-aiter-plugin:")]
    assert len(ours) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]


@pytest.mark.project
def test_help_lists_each_command_once_the_exit_codes_and_the_serving_options():
    proc = _cli("--help")
    assert proc.returncode == 0
    for command in ("demo", "doctor"):
        assert len(re.findall(rf"^\s+{command}\s", proc.stdout, re.M)) == 1, proc.stdout
    assert "--json" in proc.stdout and "exit codes:" in proc.stdout
    for code in ("0", "1", "2"):
        assert f"\n  {code}  " in proc.stdout
    doctor_help = _cli("doctor", "--help")
    assert doctor_help.returncode == 0 and "vllm serve" in doctor_help.stdout
    for option in ("--kv-cache-dtype", "--block-size", "--head-size"):
        assert option in doctor_help.stdout


@pytest.mark.project
def test_bad_doctor_option_shows_the_doctors_usage():
    proc = _cli("doctor", "--bogus")
    assert proc.returncode == 2
    assert "usage: vllm-rocm-aiter-plugin doctor [-h] [--json]" in proc.stderr
    assert "unrecognized arguments: --bogus" in proc.stderr


@pytest.mark.project
def test_the_cli_without_vllm_or_torch_exits_2_with_one_line(tmp_path):
    """The installed package run by a Python that has neither vLLM nor torch (no site-packages:
    only the package itself is on its path)."""
    (tmp_path / "vllm_rocm_aiter_plugin").symlink_to(Path(vllm_rocm_aiter_plugin.__file__).parent)
    proc = subprocess.run(
        [sys.executable, "-S", "-m", "vllm_rocm_aiter_plugin", "doctor"],
        cwd=tmp_path, env={"PYTHONPATH": str(tmp_path), "PATH": os.environ["PATH"]},
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("vllm-rocm-aiter-plugin: torch and vllm not installed in this Python")
