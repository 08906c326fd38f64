"""Children on an emulated ROCm machine (``tests/emulated_rocm/``, a test-only platform plugin
that only processes started with :func:`env` find): vLLM's real ``RocmPlatform`` on a gfx942,
gfx950, gfx90a or gfx1100 GPU, with or without AITER, whose current platform is the plugin's."""

from __future__ import annotations

import os
from pathlib import Path

PLUGIN_DIR = Path(__file__).resolve().parents[1] / "emulated_rocm"
ARCHS = ("gfx942", "gfx950", "gfx90a", "gfx1100")
INTERPRETER_ENV = {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""}
"""Triton under its interpreter: vLLM's ROCm candidates import Triton kernels, and on ROCm vLLM
keeps Triton without an active driver only where ``HIP_VISIBLE_DEVICES`` is set but empty."""


def env(arch: str, aiter: bool) -> dict[str, str]:
    """The environment of a child on a ROCm machine with one ``arch`` GPU."""
    path = os.pathsep.join(filter(None, [str(PLUGIN_DIR), os.environ.get("PYTHONPATH")]))
    return {
        **INTERPRETER_ENV, "PYTHONPATH": path, "EMULATED_ROCM_ARCH": arch,
        "EMULATED_ROCM_AITER": "1" if aiter else "0",
    }  # fmt: skip


MI300X_CHILD = """
import torch
from vllm.config import set_current_vllm_config
from vllm.platforms import current_platform
from vllm.platforms.rocm import RocmPlatform
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.attention.selector import AttentionSelectorConfig
from vllm_rocm_aiter_plugin.diagnostics import samples
from vllm_rocm_aiter_plugin.platform import AiterRocmPlatform

assert isinstance(current_platform, AiterRocmPlatform), type(current_platform)
selector = AttentionSelectorConfig(head_size=64, dtype=torch.float16, kv_cache_dtype="auto",
                                   block_size=16)
"""
"""The start of a child's code on an emulated MI300X (:func:`env` ``("gfx942", False)``): vLLM's
``RocmPlatform``, the plugin's platform class, and ``selector``, a decoder layer. Without AITER:
with it, vLLM's modules import ``aiter`` itself, whose package needs a ROCm install."""
