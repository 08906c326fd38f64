"""Hardware gates for tests/gpu and tests/rocm: each returns why a tier cannot run, or None."""

from __future__ import annotations

import os

import pytest

from vllm_rocm_aiter_plugin.diagnostics.hardware import AiterInfo, GpuInfo, detect_gpu, probe_aiter

E2E_TARGET_ENV = "VLLM_ROCM_AITER_E2E_TARGET"
E2E_DRAFT_ENV = "VLLM_ROCM_AITER_E2E_DRAFT"


def gpu_reason(cuda_available: bool, torch_version: str) -> str | None:
    if not cuda_available:
        return f"no GPU: torch.cuda.is_available() is False (torch {torch_version})"
    return None


def mi300_reason(
    cuda_available: bool,
    torch_version: str,
    torch_hip: str | None,
    gpu: GpuInfo | None,
    aiter: AiterInfo,
) -> str | None:
    reason = gpu_reason(cuda_available, torch_version)
    if reason:
        return reason
    if not torch_hip:
        name = gpu.name if gpu else "the GPU"
        return f"not ROCm: torch {torch_version} is not a HIP build ({name})"
    if gpu is None or not gpu.mi300_class:
        arch = gpu.arch if gpu else "unknown"
        return f"arch {arch} is not MI300-class (needs gfx942 or gfx950)"
    if not aiter.importable:
        return f"aiter not importable: {aiter.error}"
    return None


def e2e_reason(environ: dict[str, str] | os._Environ) -> str | None:
    missing = [name for name in (E2E_TARGET_ENV, E2E_DRAFT_ENV) if not environ.get(name)]
    if missing:
        return f"model paths unset: set {' and '.join(missing)} to local model directories"
    return None


def current_gpu_reason() -> str | None:
    import torch

    return gpu_reason(torch.cuda.is_available(), torch.__version__)


def current_mi300_reason() -> str | None:
    import torch

    available = torch.cuda.is_available()
    gpu = detect_gpu() if available else None
    aiter = probe_aiter() if available else AiterInfo(False, None, "not probed")
    return mi300_reason(
        available, torch.__version__, getattr(torch.version, "hip", None), gpu, aiter
    )


def gate(config: pytest.Config, reason: str | None) -> None:
    """Skip with ``reason``, or fail with it when hardware is required."""
    if reason is None:
        return
    if config.getoption("--require-hardware"):
        pytest.fail(f"--require-hardware: {reason}", pytrace=False)
    pytest.skip(reason)


def skip_unless_configured(reason: str | None) -> None:
    """Skip an optional test whose inputs (not hardware) are missing, even under
    ``--require-hardware``: unset model paths mean "not asked for", not a broken runner."""
    if reason is not None:
        pytest.skip(reason)


def gated_device(config: pytest.Config, reason: str | None):
    """The current GPU as a torch device, after gating on ``reason``."""
    gate(config, reason)
    import torch

    return torch.device("cuda", torch.cuda.current_device())
