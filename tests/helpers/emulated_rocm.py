"""A ROCm machine emulated in a child process, for backend-selection tests on any host.

vLLM decides that it runs on ROCm, and which GPU, through AMD's SMI library (``amdsmi``):
``vllm.platforms.rocm`` reads the GPU's ``target_graphics_version`` when imported. :func:`emulate`
answers with an ``amdsmi`` module of its own (a stand-in for AMD's library, never for vLLM), then
gives vLLM the current platform its resolution gives on a ROCm machine where the plugin's
platform plugin activates (which also asks for ``/dev/kfd``, a device no emulation makes): the
plugin's ``RocmPlatform`` subclass, on the emulated GPU. vLLM's resolution itself never runs, so
a host's own GPU (an NVIDIA one, which NVML reports whatever ``CUDA_VISIBLE_DEVICES`` says) is
not found beside the emulated one; no GPU of the host is visible to torch either. Without AITER,
the installed ``amd-aiter`` wheel is hidden from the import system, as on an image built without
it. Call it before vLLM is imported, in a child process only.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import types

MARKET_NAMES = {
    "gfx942": "AMD Instinct MI300X",
    "gfx950": "AMD Instinct MI355X",
    "gfx90a": "AMD Instinct MI250X",
    "gfx1100": "AMD Radeon PRO W7900",
}
"""The architectures the selection tests draw from, with a GPU of each."""

INTERPRETER_ENV = {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""}
"""Triton under its interpreter: vLLM's ROCm candidates import Triton kernels, and on ROCm vLLM
keeps Triton without an active driver only where ``HIP_VISIBLE_DEVICES`` is set but empty."""


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


def emulate(arch: str, aiter: bool) -> None:
    """This process as a ROCm machine with one ``arch`` GPU, with or without AITER installed,
    whose vLLM platform is the plugin's."""
    if "vllm" in sys.modules:
        raise RuntimeError("emulate() must run before vLLM is imported")
    os.environ.update(INTERPRETER_ENV)
    sys.modules["amdsmi"] = _amdsmi(arch)
    if not aiter:
        sys.meta_path[:] = [
            _PathFinderWithoutAiter if finder is importlib.machinery.PathFinder else finder
            for finder in sys.meta_path
        ]
    import vllm.platforms

    from vllm_rocm_aiter_plugin.platform import AiterRocmPlatform  # resolves no platform

    if vllm.platforms._current_platform is not None:
        raise RuntimeError("vLLM resolved its platform before the emulation could give it")
    vllm.platforms._current_platform = AiterRocmPlatform()  # where vLLM keeps the one it resolved


MI300X_CHILD = """
from tests.helpers.emulated_rocm import emulate
emulate("gfx942", aiter=False)
import torch
from vllm.config import set_current_vllm_config
from vllm.platforms.rocm import RocmPlatform
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.attention.selector import AttentionSelectorConfig
from vllm_rocm_aiter_plugin.diagnostics import samples
from vllm_rocm_aiter_plugin.platform import AiterRocmPlatform

selector = AttentionSelectorConfig(head_size=64, dtype=torch.float16, kv_cache_dtype="auto",
                                   block_size=16)
"""
"""The start of a child's code on an emulated MI300X: vLLM's ``RocmPlatform``, the plugin's
platform class, and ``selector``, a decoder layer. Without AITER: with it, vLLM's modules import
``aiter`` itself, whose package needs a ROCm install (``hipconfig``)."""
