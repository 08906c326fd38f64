"""The CPU platform with ``ROCM_AITER_FA`` selectable for attention layers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.platforms.cpu import CpuPlatform
from vllm.v1.attention.backends.registry import AttentionBackendEnum

from aiter_fa_on_cpu import missing_cpu_ops

if TYPE_CHECKING:
    from vllm.config import VllmConfig  # imported at run time, it would import this module

RUNNABLE_BACKEND = "aiter_fa_on_cpu.backend.RunnableAiterFlashAttentionBackend"
WORKER_WITHOUT_CPU_OPS = "aiter_fa_on_cpu.worker.CpuWorkerWithoutMemoryBinding"


class AiterFaOnCpuPlatform(CpuPlatform):
    """vLLM's ``CpuPlatform``; an attention layer for which ``ROCM_AITER_FA`` is selected gets
    it (as :mod:`aiter_fa_on_cpu.backend` runs it), every other selection is the CPU's own.
    Where vLLM's CPU ops are not compiled (the official wheel), the engine runs vLLM's torch-native
    custom ops and :mod:`aiter_fa_on_cpu.worker`."""

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        super().check_and_update_config(vllm_config)
        if missing_cpu_ops() is not None:
            vllm_config.parallel_config.worker_cls = WORKER_WITHOUT_CPU_OPS
            vllm_config.compilation_config.custom_ops = ["none"]

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
