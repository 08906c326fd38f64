"""What GPU this is, through torch only (never ``vllm.platforms.rocm``, which needs a ROCm GPU)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass, field

MI300_CLASS_ARCHS = ("gfx942", "gfx950")
"""gfx942: MI300X, MI300A, MI325X; gfx950: MI350X, MI355X."""


@dataclass(frozen=True)
class GpuInfo:
    name: str
    arch: str | None  # gfx target on ROCm (e.g. gfx942), "sm_90" style on CUDA
    is_rocm: bool
    mi300_class: bool = field(init=False)

    def __post_init__(self) -> None:
        arch = (self.arch or "").split(":")[0]
        object.__setattr__(self, "mi300_class", self.is_rocm and arch in MI300_CLASS_ARCHS)


def detect_gpu() -> GpuInfo | None:
    """The first visible GPU, or None when torch sees none."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    is_rocm = bool(getattr(torch.version, "hip", None))
    if is_rocm:
        arch = getattr(props, "gcnArchName", None)
        return GpuInfo(props.name, arch.split(":")[0] if arch else None, True)
    return GpuInfo(props.name, f"sm_{props.major}{props.minor}", False)


@dataclass(frozen=True)
class AiterInfo:
    importable: bool
    version: str | None
    error: str | None


def probe_aiter() -> AiterInfo:
    """Whether ``aiter`` imports (it needs ROCm), and its distribution version."""
    if importlib.util.find_spec("aiter") is None:
        return AiterInfo(False, None, "aiter is not installed")
    version = None
    for dist in ("amd-aiter", "aiter"):
        try:
            version = importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    try:
        import aiter  # noqa: F401
    except Exception as exc:  # aiter raises all sorts of errors off-ROCm
        return AiterInfo(False, version, f"{type(exc).__name__}: {exc}")
    return AiterInfo(True, version, None)
