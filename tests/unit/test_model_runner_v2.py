"""Model-runner V2 batch order, driven through vLLM's own code: its sort and build_attn_metadata."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given
from vllm.v1.attention.backends.rocm_aiter_fa import (
    AiterFlashAttentionBackend,
    AiterFlashAttentionMetadata,
)

from tests.helpers.batches import needs_v1_order, v2_steps
from tests.helpers.depth import randomised
from tests.helpers.forward_child import controls
from tests.helpers.metadata_compare import assert_same_metadata
from tests.helpers.oracle import oracle_split, rows_attending_wrongly
from vllm_rocm_aiter_plugin.backend import PluginAiterFlashAttentionBackend
from vllm_rocm_aiter_plugin.diagnostics import probe, samples
from vllm_rocm_aiter_plugin.diagnostics.cpu_host import unpinned_host_memory
from vllm_rocm_aiter_plugin.diagnostics.forward.cases import ForwardCase, chunk, decode, prompt
from vllm_rocm_aiter_plugin.diagnostics.forward.steps import in_order, laid_out
from vllm_rocm_aiter_plugin.diagnostics.model_runner import attention_group, build_through_v2

WORKSPACE_TOKENS = 32 * 1024  # vLLM's _CP_TOKENS_PER_ITER_ROCM: the gather workspace per chunk

THRESHOLDS = (1, 2, 3, 4, 5, 6, 7, 8)

# The example at threshold 1, in model-runner V2 order: a decode, a new prompt, then the
# next chunk of a long prompt with 8192 cached tokens.
V2_EXAMPLE = ForwardCase(
    "v2-example",
    (chunk("continuation", 8192, 800), decode("decode", 900), prompt("new-prompt", 50)),
    "v2",
)


class Groups:
    """Per threshold: vLLM ``AttentionGroup``s over one real Attention layer, for stock's
    backend, the plugin's, and the plugin's with its own build path switched off (vLLM's
    ``build()`` code with the plugin's split)."""

    def __init__(self, tiny_model_dir: str) -> None:
        self.groups: dict[tuple[int, str], object] = {}
        for threshold in THRESHOLDS:
            config = samples.tiny_vllm_config(tiny_model_dir, num_speculative_tokens=threshold - 1)
            layer = samples.attention_layer(config)
            spec = samples.kv_cache_spec(config)
            self.groups[threshold, "stock"] = attention_group(
                AiterFlashAttentionBackend, config, layer, spec
            )
            self.groups[threshold, "plugin"] = attention_group(
                PluginAiterFlashAttentionBackend, config, layer, spec
            )
            self.groups[threshold, "vllm-build"] = attention_group(
                controls()["plugin-vllm-build"], config, layer, spec
            )
            assert not self.groups[threshold, "vllm-build"].get_metadata_builder().own_build
            for kind in ("stock", "plugin", "vllm-build"):
                builder = self.groups[threshold, kind].get_metadata_builder()
                assert builder.reorder_batch_threshold == threshold

    def build(self, threshold: int, kind: str, cam, **kwargs) -> AiterFlashAttentionMetadata:
        with unpinned_host_memory():  # stock's extend path pins host memory; no GPU here
            return build_through_v2(self.groups[threshold, kind], cam, **kwargs)


@pytest.fixture(scope="module")
def groups(tiny_model_dir) -> Groups:
    return Groups(tiny_model_dir)


def test_v2_order_comes_from_the_installed_vllm():
    """The example's order is vLLM's: decode, new prompt, continuation (query length rules)."""
    ordered = [r.req_id for r in in_order(V2_EXAMPLE.requests, "v2", V2_EXAMPLE.threshold)]
    assert ordered == ["decode", "new-prompt", "continuation"]


def test_stock_drops_context_on_the_v2_example_and_the_plugin_does_not(groups):
    """The bug, as a test: stock puts the continuation in the prefill region, where it attends to
    its 800 new tokens and not to its 8192 cached ones. On every release."""
    query, seq, cam = laid_out(V2_EXAMPLE, "v2")

    stock = groups.build(1, "stock", cam)
    assert (stock.num_decodes, stock.num_extends, stock.num_prefills) == (1, 0, 2)
    assert rows_attending_wrongly(stock, query, seq) == [2]

    plugin = groups.build(1, "plugin", cam)
    assert (plugin.num_decodes, plugin.num_extends, plugin.num_prefills) == (1, 2, 0)
    assert (plugin.num_decode_tokens, plugin.num_extend_tokens) == (1, 850)
    assert rows_attending_wrongly(plugin, query, seq) == []
    assert_same_metadata(plugin, groups.build(1, "vllm-build", cam))


@randomised(1500)
@given(step=v2_steps())
def test_plugin_attends_truly_on_v2_ordered_steps(groups, step: ForwardCase):
    """Every V2-ordered step: the oracle's counts, and every request attends to its whole
    context plus its new tokens causally. Never a ValueError."""
    query, seq, cam = laid_out(step, "v2")
    meta = groups.build(step.threshold, "plugin", cam)
    counts = (
        meta.num_decodes,
        meta.num_extends,
        meta.num_prefills,
        meta.num_decode_tokens,
        meta.num_extend_tokens,
    )
    assert counts == oracle_split(query, seq, cam.num_actual_tokens, step.threshold)[:5]
    assert rows_attending_wrongly(meta, query, seq) == []


def _without_chunks(meta: AiterFlashAttentionMetadata) -> AiterFlashAttentionMetadata:
    if meta.extend_metadata is None:
        return meta
    extend = dataclasses.replace(meta.extend_metadata, chunk_context_metadata=None)
    return dataclasses.replace(meta, extend_metadata=extend)


@randomised(300)
@given(step=v2_steps(thresholds=(1, 2, 4, 8)))
def test_own_body_equals_vllm_build_but_for_chunk_sizes_on_v2_ordered_steps(
    groups, step: ForwardCase
):
    """The plugin's own build body against vLLM's own build() code with the same split, field by
    field, on V2-ordered steps (extend regions holding rows without context). Only the context
    chunks differ: vLLM divides the workspace among all extend rows, the own body among those
    that are not context-free prompts; its chunks stay within the workspace and are never more."""
    cam = laid_out(step, "v2")[2]
    own = groups.build(step.threshold, "plugin", cam)
    vllm = groups.build(step.threshold, "vllm-build", cam)
    assert_same_metadata(_without_chunks(own), _without_chunks(vllm))
    if own.extend_metadata is not None:
        own_chunks = own.extend_metadata.chunk_context_metadata
        vllm_chunks = vllm.extend_metadata.chunk_context_metadata
        assert max(own_chunks.total_token_per_batch) <= WORKSPACE_TOKENS
        assert 1 <= own_chunks.num_chunks <= vllm_chunks.num_chunks


@needs_v1_order
@randomised(300)
@given(step=v2_steps(thresholds=(1, 2, 4, 8), max_context=40000))
def test_v2_steps_take_no_more_context_chunks_than_stock_in_v1_order(groups, step: ForwardCase):
    """The same requests (no padding rows: ROCM_AITER_FA pads only uniform decode batches) laid out
    by model-runner V2 and by the V1 reorder: the plugin's V2 step needs no more context chunks
    than stock's V1 step, within the workspace."""
    step = dataclasses.replace(step, num_padded_reqs=0)
    plugin = groups.build(step.threshold, "plugin", laid_out(step, "v2")[2])
    stock = groups.build(step.threshold, "stock", laid_out(step, "v1")[2])
    assert _num_chunks(plugin) <= _num_chunks(stock)
    if plugin.extend_metadata is not None:
        chunks = plugin.extend_metadata.chunk_context_metadata
        assert max(chunks.total_token_per_batch) <= WORKSPACE_TOKENS


def _num_chunks(meta: AiterFlashAttentionMetadata) -> int:
    return (
        0
        if meta.extend_metadata is None
        else meta.extend_metadata.chunk_context_metadata.num_chunks
    )


@needs_v1_order
@randomised(300)
@given(step=v2_steps(thresholds=(1, 2, 4, 8)))
def test_v1_ordered_steps_stock_is_right_and_plugin_equals_it(groups, step: ForwardCase):
    """The same steps in V1 order: stock attends truly there, and the plugin equals stock."""
    query, seq, cam = laid_out(step, "v1")
    stock = groups.build(step.threshold, "stock", cam)
    assert rows_attending_wrongly(stock, query, seq) == []
    assert_same_metadata(groups.build(step.threshold, "plugin", cam), stock)


@randomised(300)
@given(step=v2_steps())
def test_stock_and_plugin_agree_wherever_stock_attends_truly(groups, step: ForwardCase):
    """On V2-ordered steps where stock leaves no context behind, the plugin equals stock."""
    query, seq, cam = laid_out(step, "v2")
    stock = groups.build(step.threshold, "stock", cam)
    plugin = groups.build(step.threshold, "plugin", cam)
    if rows_attending_wrongly(stock, query, seq):
        assert stock.num_prefills > plugin.num_prefills
    else:
        assert_same_metadata(plugin, stock)


@pytest.mark.parametrize("num_reqs, num_reqs_padded", [(5, 5), (5, 8), (1, 4)])
def test_eagle_draft_metadata_through_model_runner_v2(groups, num_reqs, num_reqs_padded):
    """The call that crashed: the V2 speculator's ``_build_draft_attn_metadata`` arguments
    (max_query_len=1, no seq_lens_cpu_upper_bound, query_start_loc_cpu clamped for padded
    requests) through ``build_attn_metadata``. Stock raises exactly on the affected releases."""
    threshold = 4  # EAGLE with 3 speculative tokens
    padding = num_reqs_padded - num_reqs
    cam = samples.make_batch(
        [1] * num_reqs + [0] * padding,
        [100 + 7 * i for i in range(num_reqs)] + [0] * padding,
        with_upper_bound=False,
    )
    clamped = torch.clamp(torch.arange(num_reqs_padded + 1, dtype=torch.int32), max=num_reqs)
    assert torch.equal(cam.query_start_loc_cpu, clamped)

    if probe.probe_stock_split().affected:
        with pytest.raises(AssertionError):
            groups.build(threshold, "stock", cam, max_query_len=1, with_upper_bound=False)
    else:
        groups.build(threshold, "stock", cam, max_query_len=1, with_upper_bound=False)
    meta = groups.build(threshold, "plugin", cam, max_query_len=1, with_upper_bound=False)
    assert type(meta) is AiterFlashAttentionMetadata
    assert (meta.num_decodes, meta.num_extends, meta.num_prefills) == (num_reqs_padded, 0, 0)
    assert meta.num_decode_tokens == num_reqs and meta.decode_metadata.max_query_len == 1
    query = [1] * num_reqs + [0] * padding
    seq = [100 + 7 * i for i in range(num_reqs)] + [0] * padding
    assert rows_attending_wrongly(meta, query, seq) == []
