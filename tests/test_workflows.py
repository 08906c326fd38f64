"""The GitHub workflow files parse and run what the README and the issue ask of them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.cpu

WORKFLOWS = Path(__file__).resolve().parents[1] / ".github" / "workflows"


def _load(name: str) -> dict:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    assert isinstance(data, dict) and data.get("jobs"), f"{name} has no jobs"
    # YAML 1.1 reads the key `on` as True.
    assert "on" in data or True in data, f"{name} has no trigger"
    for job in data["jobs"].values():
        assert job.get("runs-on") and job.get("steps"), f"{name}: a job without runs-on or steps"
        for step in job["steps"]:
            assert ("run" in step) != ("uses" in step), (
                f"{name}: step needs exactly one of run/uses"
            )
    return data


def _commands(data: dict) -> str:
    return "\n".join(s.get("run", "") for job in data["jobs"].values() for s in job["steps"])


def test_cpu_workflow_runs_ci_script():
    assert "bash .ci/run" in _commands(_load("cpu.yml"))


def test_rocm_workflow():
    data = _load("rocm.yml")
    job = data["jobs"]["mi300"]
    assert "self-hosted" in job["runs-on"] and "mi300" in job["runs-on"]
    options = job["container"]["options"]
    assert "/dev/kfd" in options and "/dev/dri" in options
    commands = _commands(data)
    assert "pip install --no-deps -e ." in commands
    assert "python3 -m vllm_rocm_aiter_plugin\n" in commands + "\n"
    assert (
        "--require-hardware" in commands
        or job["env"]["VLLM_ROCM_AITER_PLUGIN_REQUIRE_HARDWARE"] == "1"
    )
    assert "pytest tests --require-hardware" in commands
