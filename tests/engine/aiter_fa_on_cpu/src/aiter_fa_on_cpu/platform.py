"""The CPU platform with ``ROCM_AITER_FA`` selectable for attention layers."""

from __future__ import annotations

from typing import Any

from vllm.platforms.cpu import CpuPlatform
from vllm.v1.attention.backends.registry import AttentionBackendEnum

RUNNABLE_BACKEND = "aiter_fa_on_cpu.backend.RunnableAiterFlashAttentionBackend"


class AiterFaOnCpuPlatform(CpuPlatform):
    """vLLM's ``CpuPlatform``; an attention layer for which ``ROCM_AITER_FA`` is selected gets
    it (as :mod:`aiter_fa_on_cpu.backend` runs it), every other selection is the CPU's own."""

    @classmethod
    def get_attn_backend_cls(  # type: ignore[override]
        cls, selected_backend: AttentionBackendEnum | None, attn_selector_config: Any,
        *args: Any, **kwargs: Any,
    ) -> str:  # fmt: skip
        if selected_backend == AttentionBackendEnum.ROCM_AITER_FA:
            if attn_selector_config.use_mla or attn_selector_config.use_sparse:
                raise NotImplementedError("ROCM_AITER_FA serves no MLA or sparse layer")
            return RUNNABLE_BACKEND
        return super().get_attn_backend_cls(selected_backend, attn_selector_config, *args, **kwargs)
