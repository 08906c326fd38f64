"""A test-only vLLM platform plugin: a ROCm machine emulated in a child process, so that the
backend-selection tests run vLLM's real ``RocmPlatform`` on any host.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import types

ARCH_ENV, AITER_ENV = "EMULATED_ROCM_ARCH", "EMULATED_ROCM_AITER"
MARKET_NAMES = {
    "gfx942": "AMD Instinct MI300X",
    "gfx950": "AMD Instinct MI355X",
    "gfx90a": "AMD Instinct MI250X",
    "gfx1100": "AMD Radeon PRO W7900",
}


def _amdsmi(arch: str) -> types.ModuleType:
    smi = types.ModuleType("amdsmi")
    smi.__doc__ = f"AMD SMI answering one {MARKET_NAMES[arch]} ({arch}); emulated for tests."

    class AmdSmiException(Exception):
        pass

    class AmdSmiMemoryType:
        VRAM = 0

    answers = {
        "AmdSmiException": AmdSmiException,
        "AmdSmiMemoryType": AmdSmiMemoryType,
        "amdsmi_init": lambda *args, **kwargs: None,
        "amdsmi_shut_down": lambda *args, **kwargs: None,
        "amdsmi_get_processor_handles": lambda: ["gpu0"],
        "amdsmi_get_gpu_asic_info": lambda handle: {
            "target_graphics_version": arch,
            "market_name": MARKET_NAMES[arch],
        },
        "amdsmi_get_gpu_device_uuid": lambda handle: "GPU-00000000",
        "amdsmi_get_gpu_memory_total": lambda handle, kind: 192 << 30,
        "amdsmi_topo_get_link_type": lambda a, b: {"hops": 1, "type": 2},
        "amdsmi_topo_get_numa_node_number": lambda handle: 0,
    }
    for name, value in answers.items():
        setattr(smi, name, value)
    return smi


class _PathFinderWithoutAiter(importlib.machinery.PathFinder):
    """The import system's path finder, blind to the ``aiter`` package."""

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):  # type: ignore[override]
        if fullname.split(".")[0] == "aiter":
            return None
        return super().find_spec(fullname, path, target)


def platform_plugin() -> str | None:
    arch = os.environ.get(ARCH_ENV)
    if not arch:
        return None
    sys.modules.setdefault("amdsmi", _amdsmi(arch))
    if os.environ.get(AITER_ENV) != "1":
        sys.meta_path[:] = [
            _PathFinderWithoutAiter if finder is importlib.machinery.PathFinder else finder
            for finder in sys.meta_path
        ]
    return "vllm_rocm_aiter_plugin.platform.AiterRocmPlatform"
