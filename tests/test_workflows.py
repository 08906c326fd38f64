"""The workflows' own commands, run in their order on this machine as far as it allows.

Each ``run`` step is executed with bash (``-eo pipefail``, as GitHub runs it) in a copy of the
repository, with this environment's Python first on PATH as ``python3``; actions (``uses:``) are
not run, and what one job uploads the next finds in the same copy.

- ``rocm.yml``: the last step (all tiers under ``--require-hardware``) is the suite this test
  belongs to; here it runs with ``--collect-only``, which proves its arguments and the test tree
  load. Its install step puts a wheel built from the copy (the same tree) into this environment.
- ``release.yml``: every step but the uploads, on the release commit that ``docs/releases.md``
  describes. The two steps that run the suite and the installed-artifact session on the release's
  wheel run with nox's ``--list`` (the sessions exist and the noxfile loads with the wheel named):
  ``.ci/run`` runs those very sessions on every submission, this test among them.
"""

from __future__ import annotations

import datetime
import glob
import json
import os
import re
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
SUITE_SESSIONS = re.compile(r"bash scripts/nox -s (tests|installed)\b")
UPLOAD = "gh release create"


def _jobs(name: str) -> dict[str, dict]:
    return yaml.safe_load((WORKFLOWS / name).read_text())["jobs"]


def _copy(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of the repository and an environment with this Python as ``python3``."""
    work = tmp_path / "repo"
    shutil.copytree(
        REPO_ROOT, work, ignore=shutil.ignore_patterns(".git", ".nox*", ".venv*", "build", "dist")
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python3 = bin_dir / "python3"
    python3.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python3.chmod(0o755)
    env = {
        k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS", "VLLM_ROCM_AITER_PLUGIN")
    }
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    env["RUNNER_TEMP"] = str(tmp_path / "runner-temp")  # GitHub's per-job scratch folder
    os.mkdir(env["RUNNER_TEMP"])
    env.pop("VLLM_ROCM_AITER_PLUGIN_REQUIRE_HARDWARE", None)
    return work, env


def _bash(command: str, work: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-eo", "pipefail", "-c", command],
        cwd=work, env=env, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_rocm_workflow_steps_run_in_order(tmp_path):
    work, env = _copy(tmp_path)
    env["VLLM_ROCM_USE_AITER"] = "1"
    ran = []
    for step in _jobs("rocm.yml")["mi300"]["steps"]:
        command = step.get("run")
        if command is None:
            continue  # actions (checkout, upload-artifact): nothing to run here
        if "--require-hardware" in command:  # the suite itself: collect here (running it would
            # run this test again), the workflow runs it on the MI300
            command = command.replace("--require-hardware", "--require-hardware --collect-only")
        proc = _bash(command, work, env)
        ran.append(step["name"])
        if step["name"].startswith("main job") and not environment.plugin_overrides_by_default():
            assert proc.returncode == 1 and "fix NOT active" in proc.stdout
            continue
        assert proc.returncode == 0, f"step {step['name']!r} failed:\n{proc.stdout}\n{proc.stderr}"
        if step["name"].startswith("main job"):
            assert "fix ACTIVE" in proc.stdout
    assert ran == [s["name"] for s in _jobs("rocm.yml")["mi300"]["steps"] if "run" in s]
    assert (work / "before.txt").read_text() == (work / "after.txt").read_text()
    assert len(glob.glob(str(work / "dist" / "*.whl"))) == 1  # the steps built and installed it
    report = json.loads((work / "doctor.json").read_text())
    active = environment.plugin_overrides_by_default()
    assert report["policy"]["overrides_rocm_aiter_fa"] is active
    assert report["resolution"]["resolves_to_plugin"] is active
    if active:
        assert report["exit_code"] == 0 and report["verdict"].startswith("fix ACTIVE")
    else:  # an old image: the policy leaves it stock, and the JSON says why
        assert report["problems"] == [report["policy"]["message"]]


def _version(work: Path) -> str:
    namespace: dict[str, str] = {}
    exec((work / "src" / "vllm_rocm_aiter_plugin" / "_version.py").read_text(), namespace)
    return namespace["__version__"]


def _prepare_release_commit(work: Path, version: str) -> None:
    """``docs/releases.md``, step 1: the Unreleased entries become the version's section."""
    changelog = work / "CHANGELOG.md"
    today = datetime.date.today().isoformat()
    text = changelog.read_text()
    assert "## [Unreleased]" in text
    changelog.write_text(
        text.replace("## [Unreleased]", f"## [Unreleased]\n\n## [{version}] - {today}", 1)
    )


def test_release_workflow_steps_run_in_order_but_the_uploads(tmp_path):
    work, env = _copy(tmp_path)
    version = _version(work)
    _prepare_release_commit(work, version)
    env.update(GITHUB_REF_NAME=f"v{version}", GITHUB_REPOSITORY="owner/vllm-rocm-aiter-plugin",
               CI="true")  # fmt: skip
    jobs = _jobs("release.yml")
    assert list(jobs) == ["build", "test", "package-index", "github-release"]
    ran, suite_steps = [], []
    for job, spec in jobs.items():
        for step in spec["steps"]:
            command = step.get("run")
            if command is None:
                continue
            if UPLOAD in command:  # the upload itself: what it would attach is there
                for pattern in ("dist/*.whl", "dist/*.tar.gz", "SHA256SUMS", "release-notes.md"):
                    assert glob.glob(str(work / pattern)), pattern
                continue
            if SUITE_SESSIONS.search(command):
                assert 'VLLM_ROCM_AITER_PLUGIN_WHEEL="$(echo dist/*.whl)"' in command
                suite_steps.append(SUITE_SESSIONS.search(command).group(1))
                command = SUITE_SESSIONS.sub(lambda m: f"{m.group(0)} --list", command)
            proc = _bash(command, work, env)
            assert proc.returncode == 0, (
                f"{job}: {step['name']!r} failed:\n{proc.stdout}\n{proc.stderr}"
            )
            ran.append(f"{job}: {step['name']}")
    assert suite_steps == ["tests", "installed"]
    assert all(
        f"bash scripts/nox -s {s}" in (work / ".ci" / "run").read_text() for s in suite_steps
    )
    (wheel,) = glob.glob(str(work / "dist" / "*.whl"))
    (sdist,) = glob.glob(str(work / "dist" / "*.tar.gz"))
    assert Path(wheel).name == f"vllm_rocm_aiter_plugin-{version}-py3-none-any.whl"
    sums = (work / "SHA256SUMS").read_text().split()
    assert sorted(sums[1::2]) == sorted([Path(wheel).name, Path(sdist).name])
    notes = (work / "release-notes.md").read_text()
    assert notes.strip() and not [line for line in notes.splitlines() if line.startswith("## ")]


def test_the_release_stops_at_its_first_step_unless_tag_and_changelog_name_the_version(tmp_path):
    work, env = _copy(tmp_path)
    version = _version(work)
    first = _jobs("release.yml")["build"]["steps"][2]["run"]
    unprepared = _bash(first, work, {**env, "GITHUB_REF_NAME": f"v{version}"})
    assert unprepared.returncode == 1 and "CHANGELOG.md has no" in unprepared.stderr
    _prepare_release_commit(work, version)
    wrong_tag = _bash(first, work, {**env, "GITHUB_REF_NAME": "v0.0.0-not-it"})
    assert wrong_tag.returncode == 1 and f"is not v{version}" in wrong_tag.stderr
