"""The ROCm workflow's own commands, run in its order on this machine as far as it allows.

Each ``run`` step of ``.github/workflows/rocm.yml`` is executed with bash (``-eo pipefail``, as
GitHub runs it) in a copy of the repository, with this environment's Python first on PATH as
``python3``. The last step (all tiers under ``--require-hardware``) is the suite this test belongs
to; here it runs with ``--collect-only``, which proves its arguments and the test tree load.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests import environment
from tests.subprocess_util import REPO_ROOT

pytestmark = [pytest.mark.cpu, pytest.mark.subprocess]

WORKFLOWS = Path(REPO_ROOT) / ".github" / "workflows"


def _steps(name: str, job: str) -> list[dict]:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    return data["jobs"][job]["steps"]


def test_rocm_workflow_steps_run_in_order(tmp_path):
    work = tmp_path / "repo"
    shutil.copytree(
        REPO_ROOT, work, ignore=shutil.ignore_patterns(".git", ".nox*", ".venv*", "build")
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python3 = bin_dir / "python3"
    python3.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python3.chmod(0o755)
    env = {
        k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS", "VLLM_ROCM_AITER_PLUGIN")
    }
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", VLLM_ROCM_USE_AITER="1")
    env.pop("VLLM_ROCM_AITER_PLUGIN_REQUIRE_HARDWARE", None)

    try:
        ran = _run_steps(work, env)
    finally:  # the install step re-pointed this environment's editable install at the copy
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "-e", REPO_ROOT],
            check=True, capture_output=True, timeout=600, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    assert ran == [step["name"] for step in _steps("rocm.yml", "mi300") if "run" in step]
    assert (work / "before.txt").read_text() == (work / "after.txt").read_text()
    report = json.loads((work / "doctor.json").read_text())
    active = environment.plugin_overrides_by_default()
    assert report["policy"]["overrides_rocm_aiter_fa"] is active
    assert report["resolution"]["resolves_to_plugin"] is active
    if active:
        assert report["exit_code"] == 0 and report["verdict"].startswith("fix ACTIVE")
    else:  # an old image: the policy leaves it stock, and the JSON says why
        assert report["problems"] == [report["policy"]["message"]]


def _run_steps(work: Path, env: dict[str, str]) -> list[str]:
    ran = []
    for step in _steps("rocm.yml", "mi300"):
        command = step.get("run")
        if command is None:
            continue  # actions (checkout, upload-artifact): nothing to run here
        if "--require-hardware" in command:  # the suite itself: collect here (running it would
            # run this test again), the workflow runs it on the MI300
            command = command.replace("--require-hardware", "--require-hardware --collect-only")
        proc = subprocess.run(
            ["bash", "-eo", "pipefail", "-c", command],
            cwd=work, env=env, capture_output=True, text=True, timeout=900,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        ran.append(step["name"])
        if step["name"].startswith("main job") and not environment.plugin_overrides_by_default():
            assert proc.returncode == 1 and "fix NOT active" in proc.stdout
            continue
        assert proc.returncode == 0, f"step {step['name']!r} failed:\n{proc.stdout}\n{proc.stderr}"
        if step["name"].startswith("main job"):
            assert "fix ACTIVE" in proc.stdout
    return ran
