"""The hardware tiers on this machine: they collect, skip with the right reason, and fail under
``--require-hardware`` (or its environment variable)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

import pytest

from tests.conftest import REQUIRE_HARDWARE_ENV, require_hardware_default
from tests.helpers import hardware
from tests.helpers.subprocess_util import REPO_ROOT
from vllm_rocm_aiter_plugin.diagnostics.hardware import AiterInfo, GpuInfo

AITER_OK = AiterInfo(True, "0.1.5", None)
MI300X = GpuInfo("AMD Instinct MI300X", "gfx942", True)


def test_gpu_reason():
    assert hardware.gpu_reason(False, "2.13.0+cpu") == (
        "no GPU: torch.cuda.is_available() is False (torch 2.13.0+cpu)"
    )
    assert hardware.gpu_reason(True, "2.13.0") is None


@pytest.mark.parametrize(
    "available, hip, gpu, aiter, reason",
    [
        (False, None, None, AITER_OK, "no GPU: torch.cuda.is_available() is False (torch T)"),
        (True, None, GpuInfo("NVIDIA H200", "sm_90", False), AITER_OK,
         "not ROCm: torch T is not a HIP build (NVIDIA H200)"),
        (True, "6.4", GpuInfo("AMD Instinct MI250X", "gfx90a", True), AITER_OK,
         "arch gfx90a is not MI300-class (needs gfx942 or gfx950)"),
        (True, "6.4", MI300X, AiterInfo(False, None, "ImportError: libamdhip64.so"),
         "aiter not importable: ImportError: libamdhip64.so"),
        (True, "6.4", GpuInfo("AMD Instinct MI355X", "gfx950", True), AITER_OK, None),
        (True, "6.4", MI300X, AITER_OK, None),
    ],
    ids=["no-gpu", "cuda", "gfx90a", "no-aiter", "gfx950", "gfx942"],
)  # fmt: skip
def test_mi300_reason(available, hip, gpu, aiter, reason):
    assert hardware.mi300_reason(available, "T", hip, gpu, aiter) == reason


def test_e2e_reason():
    assert hardware.e2e_reason({}) == (
        "model paths unset: set VLLM_ROCM_AITER_E2E_TARGET and VLLM_ROCM_AITER_E2E_DRAFT "
        "to local model directories"
    )
    assert (
        hardware.e2e_reason({"VLLM_ROCM_AITER_E2E_TARGET": "/m", "VLLM_ROCM_AITER_E2E_DRAFT": "/d"})
        is None
    )


def test_unset_model_paths_skip_even_when_hardware_is_required(request, monkeypatch):
    monkeypatch.setattr(request.config.option, "require_hardware", True)
    with pytest.raises(pytest.fail.Exception, match="--require-hardware: no GPU"):  # control
        hardware.gate(request.config, hardware.gpu_reason(False, "T"))
    with pytest.raises(pytest.skip.Exception, match="model paths unset"):
        hardware.skip_unless_configured(hardware.e2e_reason({}))
    paths = {hardware.E2E_TARGET_ENV: "/m", hardware.E2E_DRAFT_ENV: "/d"}
    hardware.skip_unless_configured(hardware.e2e_reason(paths))  # configured: runs


def test_the_environment_variable_requires_hardware_as_the_option_does():
    """``VLLM_ROCM_AITER_PLUGIN_REQUIRE_HARDWARE=1`` is the option's default (a GPU runner's)."""
    assert require_hardware_default({REQUIRE_HARDWARE_ENV: "1"}) is True
    for unset in ({}, {REQUIRE_HARDWARE_ENV: ""}, {REQUIRE_HARDWARE_ENV: "0"}):
        assert require_hardware_default(unset) is False


@functools.cache
def _run_hardware_tiers(*args: str) -> tuple[dict, ...]:
    """Each test case of the hardware tiers as pytest reports it, run here without a GPU (once
    per test process and ``args``)."""
    env = {k: v for k, v in os.environ.items() if k != REQUIRE_HARDWARE_ENV}
    env.update({"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""})  # no GPU
    with tempfile.TemporaryDirectory() as tmp:
        junit = os.path.join(tmp, "junit.xml")
        subprocess.run(
            [sys.executable, "-m", "pytest", "tests/gpu", "tests/rocm", "-p", "no:cacheprovider",
             "-q", f"--junitxml={junit}", *args],
            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        root = ET.parse(junit).getroot()
    cases = []
    for case in root.iter("testcase"):
        outcome = next(
            (child for child in case if child.tag in ("skipped", "failure", "error")), None
        )
        cases.append(
            {
                "name": f"{case.get('classname')}.{case.get('name')}",
                "outcome": "passed" if outcome is None else outcome.tag,
                "message": "" if outcome is None else outcome.get("message", ""),
            }
        )
    return tuple(cases)


def test_hardware_tiers_skip_with_reasons():
    """Every test of both tiers is reported, and skipped with the reason (a collection error
    would be reported as an error, not a skip)."""
    cases = _run_hardware_tiers()
    gpu = [c for c in cases if ".gpu." in c["name"]]
    rocm = [c for c in cases if ".rocm." in c["name"]]
    assert gpu and rocm, [c["name"] for c in cases]
    assert {c["outcome"] for c in cases} == {"skipped"}
    assert all("no GPU: torch.cuda.is_available() is False" in c["message"] for c in cases)


def test_require_hardware_turns_skips_into_failures():
    cases = _run_hardware_tiers("--require-hardware")
    assert [c["name"] for c in cases] == [c["name"] for c in _run_hardware_tiers()]
    assert {c["outcome"] for c in cases} == {"error"}  # failed in the gating fixture
    assert all("--require-hardware: no GPU" in c["message"] for c in cases)
