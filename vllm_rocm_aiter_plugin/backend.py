"""The ROCM_AITER_FA backend the plugin registers: vLLM's backend with the plugin's builder
(``docs/deviations.md``, entry 9)."""

from __future__ import annotations

from vllm.v1.attention.backends.rocm_aiter_fa import AiterFlashAttentionBackend

from vllm_rocm_aiter_plugin.builder import PluginAiterFlashAttentionMetadataBuilder


class PluginAiterFlashAttentionBackend(AiterFlashAttentionBackend):
    """vLLM's ``AiterFlashAttentionBackend`` whose metadata builder uses the plugin's split.

    Everything else (name, kernels, impl, KV-cache layout, supported shapes) is vLLM's.
    """

    @staticmethod
    def get_builder_cls() -> type[PluginAiterFlashAttentionMetadataBuilder]:
        return PluginAiterFlashAttentionMetadataBuilder
