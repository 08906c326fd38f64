"""The plugin builder with its tensors on the GPU: same metadata as stock, and no host sync."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.metadata_compare import assert_same_metadata
from vllm_rocm_aiter_plugin.diagnostics import probe, samples
from vllm_rocm_aiter_plugin.split import split_decodes_prefills_and_extends as plugin_split

pytestmark = pytest.mark.gpu

CASES = [
    # name, speculative tokens (threshold = 1 + n), query lens, seq lens
    ("pure-decode", 0, [1] * 6, [30, 41, 52, 63, 74, 85]),
    ("eagle-pure-decode", 3, [4] * 6, [30, 41, 52, 63, 74, 85]),
    ("extend-only", 0, [5, 9, 33], [500, 3000, 9000]),
    ("prefill-only", 0, [7, 120, 3], [7, 120, 3]),
    ("decode+extend+prefill", 0, [1, 1, 6, 30, 9, 5], [40, 17, 600, 2100, 9, 5]),
    ("eagle-decode+extend+prefill", 3, [4, 2, 9, 70, 2, 5], [50, 60, 700, 70, 2, 5]),
]


def _pair(tiny_model_dir, device, spec_tokens, window):
    from vllm.v1.attention.backends.rocm_aiter_fa import AiterFlashAttentionMetadataBuilder

    from vllm_rocm_aiter_plugin.builder import PluginAiterFlashAttentionMetadataBuilder

    config = samples.tiny_vllm_config(tiny_model_dir, num_speculative_tokens=spec_tokens)
    layer = samples.attention_layer(config, sliding_window=window)
    spec = samples.kv_cache_spec(config, sliding_window=window)
    return (
        AiterFlashAttentionMetadataBuilder(spec, [layer], config, device),
        PluginAiterFlashAttentionMetadataBuilder(spec, [layer], config, device),
    )


@pytest.mark.parametrize("window", [None, 64], ids=["full", "sliding-window"])
@pytest.mark.parametrize(
    "name, spec_tokens, query_lens, seq_lens", CASES, ids=[c[0] for c in CASES]
)
def test_same_metadata_as_stock_on_gpu(
    tiny_model_dir, device, window, name, spec_tokens, query_lens, seq_lens
):
    stock_builder, plugin_builder = _pair(tiny_model_dir, device, spec_tokens, window)
    batch = samples.make_batch(query_lens, seq_lens, device=device)
    plugin = plugin_builder.build(0, batch)
    stock = stock_builder.build(0, batch)
    torch.cuda.synchronize()
    assert_same_metadata(plugin, stock)
    assert plugin.seq_lens.device == device


@pytest.mark.parametrize("spec_tokens", [0, 3], ids=["threshold-1", "eagle-threshold-4"])
def test_pure_decode_without_upper_bound_never_syncs(tiny_model_dir, device, spec_tokens):
    _, plugin_builder = _pair(tiny_model_dir, device, spec_tokens, None)
    q = 1 + spec_tokens
    batch = samples.make_batch(
        [q] * 8, [100 + 13 * i for i in range(8)], device=device, with_upper_bound=False
    )
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        meta = plugin_builder.build(0, batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert meta.num_decodes == 8 and meta.num_decode_tokens == 8 * q


def test_sync_debug_mode_catches_the_mixed_path_copy(device):
    """Control: the same mode does raise on the copy the mixed path makes without the upper bound."""
    batch = samples.make_batch([1, 6], [40, 6], device=device, with_upper_bound=False)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchroniz"):
            plugin_split(batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_the_real_bug_on_gpu(tiny_model_dir, device):
    stock_builder, plugin_builder = _pair(tiny_model_dir, device, 3, None)
    batch = samples.make_batch(
        [4] * 5, [60 + i for i in range(5)], device=device, with_upper_bound=False
    )
    if probe.probe_stock_split().affected:
        with pytest.raises(AssertionError):
            stock_builder.build(0, batch)
    else:
        stock_builder.build(0, batch)
    meta = plugin_builder.build(0, batch)
    assert meta.num_decodes == 5 and meta.decode_metadata.max_query_len == 4
