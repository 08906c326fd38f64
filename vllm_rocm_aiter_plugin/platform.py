"""The plugin's ROCm platform: vLLM's ``RocmPlatform`` plus ``VLLM_ATTENTION_BACKEND`` selection.

Imported only when ``platform_plugin`` found a ROCm GPU: ``vllm.platforms.rocm`` queries the GPU
at import time and cannot be imported elsewhere. Why: ``docs/deviations.md``, entry 10.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm.platforms.rocm import RocmPlatform

from vllm_rocm_aiter_plugin.env_backend import apply_env_attention_backend

if TYPE_CHECKING:
    from vllm.config import VllmConfig


class AiterRocmPlatform(RocmPlatform):
    """vLLM's ROCm platform that also honours ``VLLM_ATTENTION_BACKEND``."""

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        apply_env_attention_backend(vllm_config)
        super().check_and_update_config(vllm_config)
