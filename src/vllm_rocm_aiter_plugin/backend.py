"""The ROCM_AITER_FA backends the plugin registers: vLLM's backend with the plugin's builder and
impl (``docs/deviations.md``, "backend: registration"), or, in observe mode, vLLM's own with a
builder that only counts."""

from __future__ import annotations

from vllm.v1.attention.backends.rocm_aiter_fa import AiterFlashAttentionBackend

from vllm_rocm_aiter_plugin.builder import (
    ObservingAiterFlashAttentionMetadataBuilder,
    PluginAiterFlashAttentionMetadataBuilder,
)
from vllm_rocm_aiter_plugin.impl import PluginAiterFlashAttentionImpl


class PluginAiterFlashAttentionBackend(AiterFlashAttentionBackend):
    """vLLM's ``AiterFlashAttentionBackend`` with the plugin's metadata builder and impl."""

    @staticmethod
    def get_builder_cls() -> type[PluginAiterFlashAttentionMetadataBuilder]:
        return PluginAiterFlashAttentionMetadataBuilder

    @staticmethod
    def get_impl_cls() -> type[PluginAiterFlashAttentionImpl]:
        return PluginAiterFlashAttentionImpl


class ObservingAiterFlashAttentionBackend(AiterFlashAttentionBackend):
    """vLLM's ``AiterFlashAttentionBackend``, its impl and its ``build()``, counting the requests
    its split serves without their context (``VLLM_ROCM_AITER_PLUGIN=observe``)."""

    @staticmethod
    def get_builder_cls() -> type[ObservingAiterFlashAttentionMetadataBuilder]:
        return ObservingAiterFlashAttentionMetadataBuilder
