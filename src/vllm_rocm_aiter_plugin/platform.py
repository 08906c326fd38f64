"""The plugin's ROCm platform: vLLM's ``RocmPlatform`` plus ``VLLM_ATTENTION_BACKEND`` selection
(:mod:`.env_backend`; why: ``docs/deviations.md``, "platform: VLLM_ATTENTION_BACKEND").
"""

from __future__ import annotations

from typing import Any

from vllm.platforms.rocm import RocmPlatform

from vllm_rocm_aiter_plugin.env_backend import select_attention_backend, stock_offer


class AiterRocmPlatform(RocmPlatform):
    """vLLM's ROCm platform whose backend selection also honours ``VLLM_ATTENTION_BACKEND``,
    among the backends stock's automatic selection accepts for each layer."""

    @classmethod
    def get_attn_backend_cls(cls, selected_backend: Any, *args: Any, **kwargs: Any) -> str:
        # The variable is read from the environment, which vLLM's worker processes inherit.
        select = super().get_attn_backend_cls
        return select_attention_backend(
            select,
            selected_backend,
            *args,
            offer=lambda: stock_offer(cls, select, *args, **kwargs),
            **kwargs,
        )
