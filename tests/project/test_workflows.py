"""The workflows' own commands, run in their order on this machine as far as it allows, and what
zizmor (the lint session) does not audit: no fork's code on the self-hosted runner, the release's
order, an update bot for the actions' pins."""

from __future__ import annotations

import datetime
import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import commands
from tests.helpers.subprocess_util import REPO_ROOT

WORKFLOWS = Path(REPO_ROOT) / ".github" / "workflows"
SUITE_SESSIONS = re.compile(r"bash scripts/nox -s (tests)\b")
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


def _image_over_this_environment(tmp_path: Path) -> Path:
    """A venv whose Python sees this environment's packages after its own (a ``.pth`` file):
    what a step installs lands in the venv, and this environment is left as it is."""
    image = tmp_path / "image"
    subprocess.run([sys.executable, "-m", "venv", str(image)], check=True)
    (site,) = glob.glob(str(image / "lib" / "python*" / "site-packages"))
    here = [p for p in sys.path if p.endswith("site-packages")]
    (Path(site) / "this-environment.pth").write_text("\n".join(here) + "\n")
    return image / "bin" / "python"


def test_rocm_workflow_steps_run_in_order(tmp_path):
    work, env = _copy(tmp_path)
    wrapper = Path(env["PATH"].split(os.pathsep)[0]) / "python3"
    wrapper.write_text(f'#!/bin/sh\nexec "{_image_over_this_environment(tmp_path)}" "$@"\n')
    env["VLLM_ROCM_USE_AITER"] = "1"
    ran = []
    for step in _jobs("rocm.yml")["mi300"]["steps"]:
        command = step.get("run")
        if command is None:
            continue  # actions (checkout, upload-artifact): nothing to run here
        ran.append(step["name"])
        if step["name"].startswith("main job"):
            assert command.strip() == " ".join(commands.DEMO)
            continue
        if step["name"].startswith("doctor"):
            assert command.startswith(" ".join(commands.DOCTOR_JSON) + " > doctor.json")
            continue
        if "--require-hardware" in command:  # the suite itself: collect here (running it would
            # run this test again), the workflow runs it on the MI300
            command = command.replace("--require-hardware", "--require-hardware --collect-only")
        proc = _bash(command, work, env)
        assert proc.returncode == 0, f"step {step['name']!r} failed:\n{proc.stdout}\n{proc.stderr}"
    assert ran == [s["name"] for s in _jobs("rocm.yml")["mi300"]["steps"] if "run" in s]
    assert len(glob.glob(str(work / "dist" / "*.whl"))) == 1  # the steps built it
    assert dict(commands.AITER_ON) == {
        k: v for k, v in _workflow_env().items() if k == "VLLM_ROCM_USE_AITER"
    }


def _workflow_env() -> dict[str, str]:
    return yaml.safe_load((WORKFLOWS / "rocm.yml").read_text())["jobs"]["mi300"]["env"]


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


def _git(work: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=work, check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip


def _commit_on_main(work: Path) -> str:
    """The copy as a checkout with history: one commit, which ``origin/main`` also names (what
    ``actions/checkout`` with ``fetch-depth: 0`` gives); returns its SHA."""
    _git(work, "init", "-q")
    _git(work, "add", "-A")
    _git(work, "commit", "-q", "-m", "release commit")
    sha = _git(work, "rev-parse", "HEAD")
    _git(work, "update-ref", "refs/remotes/origin/main", sha)
    return sha


needs_the_release_python = pytest.mark.skipif(
    sys.version_info[:2] != (3, 11),
    reason=f"the release workflow's steps run scripts/nox, which needs Python 3.11; this is "
    f"Python {sys.version_info[0]}.{sys.version_info[1]} (a ROCm image's, say)",
)


@needs_the_release_python
def test_release_workflow_steps_run_in_order_but_the_uploads(tmp_path):
    work, env = _copy(tmp_path)
    version = _version(work)
    _prepare_release_commit(work, version)
    env.update(GITHUB_REF_NAME=f"v{version}", GITHUB_REPOSITORY="owner/vllm-rocm-aiter-plugin",
               CI="true", GITHUB_SHA=_commit_on_main(work))  # fmt: skip
    jobs = _jobs("release.yml")
    assert list(jobs) == ["build", "test", "package-index", "github-release"]
    ran, suite_steps = [], []
    for job, spec in jobs.items():
        for step in spec["steps"]:
            command = step.get("run")
            if command is None:
                continue
            if UPLOAD in command:  # the upload itself: what it would attach is there
                notes = "build/release-notes.md"
                for pattern in ("dist/*.whl", "dist/*.tar.gz", "SHA256SUMS", notes):
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
    assert suite_steps == ["tests"]
    assert all(
        f"bash scripts/nox -s {s}" in (work / ".ci" / "run").read_text() for s in suite_steps
    )
    assert "build: the tagged commit is on main" in ran
    (wheel,) = glob.glob(str(work / "dist" / "*.whl"))
    (sdist,) = glob.glob(str(work / "dist" / "*.tar.gz"))
    assert Path(wheel).name == f"vllm_rocm_aiter_plugin-{version}-py3-none-any.whl"
    sums = (work / "SHA256SUMS").read_text().split()
    assert sorted(sums[1::2]) == sorted([Path(wheel).name, Path(sdist).name])
    notes = (work / "build" / "release-notes.md").read_text()
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


def test_a_tag_on_a_commit_off_main_stops_the_release(tmp_path):
    work, env = _copy(tmp_path)
    _commit_on_main(work)
    _git(work, "checkout", "-q", "-b", "side")
    _git(work, "commit", "-q", "--allow-empty", "-m", "not on main")
    off_main = _git(work, "rev-parse", "HEAD")
    (step,) = [s for s in _jobs("release.yml")["build"]["steps"] if "on main" in s.get("name", "")]
    proc = _bash(step["run"], work, {**env, "GITHUB_SHA": off_main, "GITHUB_REF_NAME": "v9.9.9"})
    assert proc.returncode == 1 and "is not on main" in proc.stderr


@pytest.mark.parametrize(
    "tag, pre", [("v1.2.0", False), ("v1.2.0rc1", True), ("v1.2.0.dev3", True), ("v1.2.0b2", True)]
)
def test_pre_release_tags_make_pre_releases(tmp_path, tag, pre):
    """The upload step's own test of the tag (``gh`` replaced by a recorder on PATH)."""
    work, env = _copy(tmp_path)
    (step,) = [
        s for s in _jobs("release.yml")["github-release"]["steps"] if UPLOAD in s.get("run", "")
    ]
    bin_dir = tmp_path / "gh-bin"
    bin_dir.mkdir()
    gh = bin_dir / "gh"
    gh.write_text('#!/bin/sh\n[ "$2" = view ] && exit 1\necho "$@" >> "$GH_LOG"\n')
    gh.chmod(0o755)
    log = tmp_path / "gh.log"
    env = {**env, "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}", "GH_LOG": str(log),
           "GITHUB_REF_NAME": tag, "GITHUB_REPOSITORY": "o/r"}  # fmt: skip
    proc = _bash(step["run"], work, env)
    assert proc.returncode == 0, proc.stderr
    (call,) = log.read_text().splitlines()
    assert call.startswith(f"release create {tag} ")
    assert ("--prerelease" in call.split()) is pre


def test_a_forks_pull_request_never_reaches_the_self_hosted_runner():
    (job,) = _jobs("rocm.yml").values()
    assert "self-hosted" in job["runs-on"]
    assert job["if"] == (
        "github.event_name != 'pull_request' || "
        "github.event.pull_request.head.repo.full_name == github.repository"
    )


def test_the_github_release_waits_for_the_package_index_and_the_bot_keeps_the_pins_fresh():
    assert _jobs("release.yml")["github-release"]["needs"] == ["test", "package-index"]
    bot = yaml.safe_load((WORKFLOWS.parent / "dependabot.yml").read_text())
    assert {u["package-ecosystem"] for u in bot["updates"]} == {"github-actions"}
