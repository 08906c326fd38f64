"""The release watch fires: its step, run as the workflow writes it against a package index planted
here (through pip's own configuration), fails naming a newer vLLM and hands it to the next step."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.helpers.subprocess_util import REPO_ROOT
from vllm_rocm_aiter_plugin import releases

WORKFLOW = Path(REPO_ROOT) / ".github" / "workflows" / "release-watch.yml"

pytestmark = pytest.mark.skipif(
    sys.version_info[:2] != (3, 11),
    reason="the watch runs scripts/nox, which needs Python 3.11 (this is a ROCm image's Python?)",
)


def _steps() -> list[dict]:
    return yaml.safe_load(WORKFLOW.read_text())["jobs"]["newer-vllm"]["steps"]


def _detection() -> dict:
    (step,) = [s for s in _steps() if s.get("id") == "index"]
    return step


def _wheel(folder: Path, version: str) -> str:
    """A real (tiny) wheel of a package named vllm."""
    name = f"vllm-{version}-py3-none-any.whl"
    info = f"vllm-{version}.dist-info"
    with zipfile.ZipFile(folder / name, "w") as wheel:
        wheel.writestr("vllm/__init__.py", f"__version__ = {version!r}\n")
        wheel.writestr(
            f"{info}/METADATA", f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
        )
        wheel.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(f"{info}/RECORD", "")
    return name


def _index(root: Path, versions: list[str]) -> str:
    """A PEP 503 simple index under ``root`` offering vllm at ``versions``; its URL."""
    files, page = root / "files", root / "simple" / "vllm"
    files.mkdir(parents=True)
    page.mkdir(parents=True)
    links = [f'<a href="../../files/{n}">{n}</a>' for n in (_wheel(files, v) for v in versions)]
    (page / "index.html").write_text("<html><body>\n" + "\n".join(links) + "\n</body></html>\n")
    return (root / "simple").as_uri()


def _next(version: str, minor: int = 1) -> str:
    major, low, _ = releases.parse(version) or (0, 0, 0)
    return f"{major}.{low + minor}.0"


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A copy of the tracked tree whose nox bootstrap is built with pip's configuration as it is;
    the environment the watch's step then runs in: no pip configuration but the index a test
    plants (``PIP_INDEX_URL``)."""
    work = tmp_path_factory.mktemp("watch") / "repo"
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True,
                            check=False).stdout.decode()  # fmt: skip
    names = [n for n in listed.split("\0") if n] or None
    if names is None:
        pytest.skip("not a git checkout (an sdist): the watch runs in the repository")
    for name in names:
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(Path(REPO_ROOT) / name, work / name)
    env = {**os.environ, "PYTHON": sys.executable}
    built = subprocess.run(["bash", "scripts/nox", "--list"], cwd=work, env=env,
                           capture_output=True, text=True, timeout=900, check=False)  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    clean = {k: v for k, v in env.items() if not k.startswith("PIP_")}
    return work, {**clean, "PIP_CONFIG_FILE": os.devnull}


def _watch(checkout, tmp_path: Path, versions: list[str] | None) -> tuple[int, str, str]:
    """The detection step's ``run`` against an index offering ``versions`` (None: an index that
    has no vllm at all): (exit code, its output, what it wrote to ``$GITHUB_OUTPUT``)."""
    work, env = checkout
    url = _index(tmp_path / "index", versions) if versions is not None else (tmp_path).as_uri()
    outputs = tmp_path / "github-output"
    outputs.touch()
    proc = subprocess.run(
        ["bash", "-eo", "pipefail", "-c", _detection()["run"]], cwd=work,
        env={**env, "PIP_INDEX_URL": url, "GITHUB_OUTPUT": str(outputs)},
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr, outputs.read_text()


def test_a_newer_release_on_the_index_fails_the_job_and_names_it(checkout, tmp_path):
    newer = _next(releases.NEWEST)
    pre = f"{_next(releases.NEWEST, 2)}rc1"  # pre-releases are not releases to verify
    code, output, outputs = _watch(checkout, tmp_path, ["0.20.0", releases.NEWEST, newer, pre])
    assert code != 0, output
    assert f"vLLM {newer} on the package index: newer than the tested range" in output, output
    assert outputs.splitlines() == [f"version={newer}"]


def test_the_next_step_verifies_the_release_the_detection_named():
    steps = _steps()
    verify = steps[steps.index(_detection()) + 1]
    assert verify["if"] == "failure() && steps.index.outputs.version != ''"
    assert verify["env"] == {"VERSION": "${{ steps.index.outputs.version }}"}
    assert verify["run"] == 'bash scripts/nox -s verify -- "$VERSION"'


def test_no_newer_release_passes(checkout, tmp_path):
    pre = f"{_next(releases.NEWEST)}rc1"
    code, output, outputs = _watch(checkout, tmp_path, [releases.OLDEST, releases.NEWEST, pre])
    assert code == 0, output
    assert f"the newest vLLM release on the index is {releases.NEWEST}" in output
    assert outputs == ""


def test_an_index_that_cannot_be_read_fails_the_job(checkout, tmp_path):
    code, output, outputs = _watch(checkout, tmp_path, None)
    assert code != 0 and "could not read vLLM's releases from the package index" in output, output
    assert outputs == ""
