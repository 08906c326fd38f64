"""Per-vLLM-version environments: torch 2.13.0 (CPU), the vLLM wheel with --no-deps, pinned deps.

Sessions:
  demo                 the main job on vLLM 0.23.0, an affected release (python -m vllm_rocm_aiter_plugin)
  tests                the CPU suite against each CI vLLM release (0.23.0 buggy, 0.33.0 newest)
  lint                 ruff
  compat               the CPU suite against every release 0.20.0-0.33.0 in one environment,
                       swapping vLLM with --no-deps; writes compat/results.md (see scripts/compat.py)
  bench                benchmarks/bench_builder.py against the newest vLLM
  trace                benchmarks/serving_trace.py (vLLM's Scheduler, model-runner V2 order)
  verify -- VERSION    the CPU suite on one vLLM release, then scripts/verify_release.py VERSION
Pass extra pytest arguments after --, e.g. ``scripts/nox -s tests -- -k split``.
"""

from __future__ import annotations

import glob
import hashlib
import os

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True  # rebuilt when the stamp below changes
nox.options.sessions = ["lint", "tests"]

TORCH = os.environ.get("TORCH_SPEC", "torch==2.13.0")
CI_VLLM = ["0.23.0", "0.33.0"]
NEWEST_VLLM = CI_VLLM[-1]
DEMO_VLLM = "0.23.0"  # affected by both bugs, and MRV2 is the default for Llama there
ALL_VLLM = [
    "0.20.0", "0.20.1", "0.20.2", "0.21.0", "0.22.0", "0.22.1", "0.23.0", "0.24.0", "0.25.0",
    "0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0",
    "0.33.0",
]  # fmt: skip
QUIET = ["--quiet", "--disable-pip-version-check"]
STACK_FILES = ["requirements/vllm-cpu.txt", "requirements/test.txt", "setup.py"]
STAMP = ".stack-stamp"


def _stamp(files: list[str], *extra: str) -> str:
    """What an environment was built from: the pinned files' contents and the other pins."""
    digest = hashlib.sha256()
    for item in [*extra, *files]:
        digest.update(item.encode())
        if os.path.exists(item):
            with open(item, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()


def _installed_vllm(session: nox.Session) -> str | None:
    found = glob.glob(os.path.join(session.virtualenv.location, "lib", "*", "site-packages",
                                   "vllm-*.dist-info"))  # fmt: skip
    return os.path.basename(found[0])[len("vllm-") : -len(".dist-info")] if found else None


def _reuse(session: nox.Session, stamp: str) -> bool:
    path = os.path.join(session.virtualenv.location, STAMP)
    if os.path.exists(path):
        with open(path) as f:
            return f.read() == stamp
    return False


def _record(session: nox.Session, stamp: str) -> None:
    with open(os.path.join(session.virtualenv.location, STAMP), "w") as f:
        f.write(stamp)


def install_stack(session: nox.Session, vllm_version: str, *extra_files: str) -> None:
    """torch first (so nothing pulls a CUDA build), then pinned deps, then vLLM and the plugin.

    An environment whose stamp (torch pin, requirement files, setup.py) is unchanged is reused
    as it is; only a different vLLM release is swapped in (``--no-deps``)."""
    files = [*STACK_FILES, *extra_files]
    stamp = _stamp(files, TORCH)
    if not _reuse(session, stamp):
        session.install(*QUIET, TORCH)
        session.install(*QUIET, *(a for f in files if f.endswith(".txt") for a in ("-r", f)))
        session.install(*QUIET, "--no-deps", f"vllm=={vllm_version}")
        session.install(*QUIET, "--no-deps", "-e", ".")
        _record(session, stamp)
    elif _installed_vllm(session) != vllm_version:
        session.install(*QUIET, "--no-deps", "--force-reinstall", f"vllm=={vllm_version}")
    else:
        session.log(f"reusing {session.virtualenv.location} (stamp unchanged, vLLM {vllm_version})")


@nox.session
def demo(session: nox.Session) -> None:
    install_stack(session, DEMO_VLLM)
    session.run("python", "-m", "vllm_rocm_aiter_plugin", *session.posargs)


@nox.session
@nox.parametrize("vllm", CI_VLLM)
def tests(session: nox.Session, vllm: str) -> None:
    install_stack(session, vllm)
    junit = os.path.join(session.create_tmp(), f"junit-vllm-{vllm}.xml")
    os.makedirs("build", exist_ok=True)
    session.run("pytest", f"--junitxml={junit}", "-p", "no:cacheprovider", *session.posargs)
    session.run("python", "scripts/junit_summary.py", junit, f"build/junit-vllm-{vllm}.xml")


@nox.session
def lint(session: nox.Session) -> None:
    stamp = _stamp(["requirements/lint.txt"])
    if not _reuse(session, stamp):
        session.install(*QUIET, "-r", "requirements/lint.txt")
        _record(session, stamp)
    session.run("ruff", "check", ".")


@nox.session
def compat(session: nox.Session) -> None:
    versions = session.posargs or ALL_VLLM
    install_stack(session, versions[-1])
    session.run("python", "scripts/compat.py", *versions)


@nox.session
def bench(session: nox.Session) -> None:
    install_stack(session, NEWEST_VLLM, "requirements/bench.txt")
    args = session.posargs or [
        "--json", "benchmarks/results/bench.json", "--plot", "benchmarks/results/latency.png",
    ]  # fmt: skip
    os.makedirs("benchmarks/results", exist_ok=True)
    session.run("python", "benchmarks/bench_builder.py", *args)


@nox.session
def trace(session: nox.Session) -> None:
    install_stack(session, NEWEST_VLLM, "requirements/bench.txt")
    args = session.posargs or [
        "--json", "benchmarks/results/serving_trace.json",
        "--markdown", "benchmarks/results/serving_trace.md",
        "--plot", "benchmarks/results/serving_trace.png",
    ]  # fmt: skip
    os.makedirs("benchmarks/results", exist_ok=True)
    session.run("python", "benchmarks/serving_trace.py", *args)


@nox.session
def verify(session: nox.Session) -> None:
    """A release outside the table: the whole CPU suite on it, then the differential tests with
    the own build path forced on, which print the fingerprint line to add if they pass."""
    if len(session.posargs) != 1:
        session.error("usage: bash scripts/nox -s verify -- VERSION")
    version = session.posargs[0]
    install_stack(session, version)
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider")
    session.run("python", "scripts/verify_release.py", version)
