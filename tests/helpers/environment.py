"""What this machine is, detected independently of the code under test: tests take their
expectations from here, so that the CPU tier holds on a CPU box, a CUDA box and an MI300."""

from __future__ import annotations

import importlib
import os
import sysconfig
from pathlib import Path

from packaging.version import Version

from tests.helpers import vllm_releases

TESTED_RANGE = tuple(Version(v) for v in vllm_releases.TABLE)  # the README's release table


def gpu_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def rocm_torch() -> bool:
    import torch

    return bool(getattr(torch.version, "hip", None))


def rocm_gpu() -> bool:
    """A GPU visible to a HIP build of torch (what ROCM_AITER_FA needs)."""
    return gpu_visible() and rocm_torch()


def fp8_format_of_forward_device() -> str:
    """The fp8 format the forward check reads a cache in: the GPU's own where torch sees one
    (``current_platform.fp8_dtype()``), MI300's on CPU."""
    if not gpu_visible():
        return "float8_e4m3fnuz"
    from vllm.platforms import current_platform

    return str(current_platform.fp8_dtype()).removeprefix("torch.")


def kfd_present() -> bool:
    return os.path.exists("/dev/kfd")


def aiter_importable() -> bool:
    try:
        importlib.import_module("aiter")
    except Exception:  # aiter raises all sorts of errors off-ROCm
        return False
    return True


AITER_PIN_FILE = Path(__file__).resolve().parents[2] / "requirements" / "aiter-cpu.txt"


def pinned_aiter_installed() -> bool:
    """Whether the ``amd-aiter`` wheel installed here is the one the CPU tier pins."""
    import importlib.metadata

    pins = [line.split("#", 1)[0].strip() for line in AITER_PIN_FILE.read_text().splitlines()]
    (pin,) = [p for p in pins if p]
    name, version = pin.split("==")
    try:
        return importlib.metadata.version(name) == version
    except importlib.metadata.PackageNotFoundError:
        return False


def vllm_in_tested_range() -> bool:
    low, high = TESTED_RANGE
    return low <= Version(vllm_releases.release()) <= high


def plugin_overrides_by_default() -> bool:
    """Whether the plugin takes ROCM_AITER_FA with its switch unset: on every release from the
    oldest in the README's table on (newer ones too, with a WARNING); older ones stay stock."""
    return Version(vllm_releases.release()) >= TESTED_RANGE[0]


def is_installed_copy(file: str) -> bool:
    """Whether ``file`` lies in this environment's site-packages (where pip put the wheel; under
    ``.nox/`` that is inside the repository) and not in the checkout's source tree."""
    path = Path(file).resolve()
    site = Path(sysconfig.get_path("purelib")).resolve()
    source = Path(__file__).resolve().parents[2] / "src"
    return site in path.parents and source not in path.parents
