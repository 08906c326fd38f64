"""Attention sinks (gpt-oss: one learned logit per query head in every softmax)."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers.depth import randomised
from tests.helpers.scheduler_trace import prompt_before_context
from vllm_rocm_aiter_plugin import impl
from vllm_rocm_aiter_plugin.diagnostics import probe
from vllm_rocm_aiter_plugin.diagnostics.forward import reference_kernels
from vllm_rocm_aiter_plugin.diagnostics.forward.cases import CASES, ForwardCase

SINK_CASES = [c for c in CASES if c.sinks]


def _qkv(queries: int, keys: int, heads: int = 2, kv_heads: int = 1, d: int = 16) -> tuple:
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(queries, heads, d, generator=generator)
    k = torch.randn(keys, kv_heads, d, generator=generator)
    v = torch.randn(keys, kv_heads, d, generator=generator)
    return q, k, v


def test_the_sink_cases_cover_both_orders_a_window_and_a_moved_prompt():
    assert {c.order for c in SINK_CASES} == {"v1", "v2"}
    assert any(c.sliding_window for c in SINK_CASES)
    assert any(not c.sliding_window and prompt_before_context(c) for c in SINK_CASES)
    for case in SINK_CASES:
        assert len(case.sinks) == case.num_heads, case.name
    assert ForwardCase.from_json(json.loads(json.dumps(SINK_CASES[0].to_json()))) == SINK_CASES[0]


def test_the_reference_counts_the_sink_once_as_a_key_with_value_zero():
    q, k, v = _qkv(5, 7)
    sink = torch.tensor([1.5, -0.5])
    scale = 16**-0.5
    out, lse = reference_kernels.attend(q, k, v, scale, True, sink=sink)
    scores = torch.einsum("qhd,khd->hqk", q, k.expand(-1, 2, -1)) * scale
    keep = torch.arange(7)[None, :] <= torch.arange(5)[:, None] + 2  # bottom-right causal
    scores = scores.masked_fill(~keep, float("-inf"))
    with_sink = torch.cat([scores, sink[:, None, None].expand(2, 5, 1)], dim=-1)
    probs = torch.softmax(with_sink, dim=-1)[..., :-1]
    want = torch.einsum("hqk,khd->qhd", probs, v.expand(-1, 2, -1))
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(lse, torch.logsumexp(with_sink, dim=-1))


def test_a_row_with_no_key_gives_zero_and_the_sink_as_its_lse():
    q, k, v = _qkv(3, 0)
    sink = torch.tensor([1.5, -0.5])
    out, lse = reference_kernels.attend(q, k, v, 0.25, False, sink=sink)
    assert bool((out == 0).all())
    torch.testing.assert_close(lse, sink[:, None].expand(2, 3))
    _, lse_without = reference_kernels.attend(q, k, v, 0.25, False)
    assert bool(torch.isneginf(lse_without).all())


def _merge(states: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """What ``merge_attn_states`` computes: outputs weighted by ``exp(lse)``."""
    lses = torch.stack([lse for _, lse in states])  # [calls, heads, tokens]
    weights = torch.softmax(lses, dim=0).permute(0, 2, 1)[..., None]  # [calls, tokens, heads, 1]
    return sum(w * out for w, (out, _) in zip(weights, states, strict=True))


def test_merged_calls_count_the_sink_once_per_call_that_carries_it():
    """The extend path's arithmetic on the references: new tokens causally, the context in two
    chunks non-causally. Every call with the sink (stock) is off; the sink on the new-token call
    only (the plugin's impl) equals attention over the whole context with the sink once."""
    q, k, v = _qkv(4, 24)
    sink = torch.tensor([2.0, 3.0])
    scale = 16**-0.5
    want, _ = reference_kernels.attend(q, k, v, scale, True, sink=sink)
    new, chunks = slice(20, 24), (slice(0, 12), slice(12, 20))  # 20 cached tokens in 2 chunks

    def calls(chunk_sink: torch.Tensor | None) -> list:
        states = [reference_kernels.attend(q, k[new], v[new], scale, True, sink=sink)]
        states += [
            reference_kernels.attend(q, k[c], v[c], scale, False, sink=chunk_sink) for c in chunks
        ]
        return states

    torch.testing.assert_close(_merge(calls(None)), want)
    stock = _merge(calls(sink))
    assert float((stock - want).abs().max()) > 1e-2
    # counted three times: each state's weight has the sink in it
    _, lse_keys = reference_kernels.attend(q, k, v, scale, True)
    shrink = torch.exp(lse_keys) / (torch.exp(lse_keys) + 3 * torch.exp(sink)[:, None])
    full = torch.exp(lse_keys) / (torch.exp(lse_keys) + torch.exp(sink)[:, None])
    expected = want * (shrink / full).transpose(0, 1)[..., None]
    torch.testing.assert_close(stock, expected)


@randomised(40)
@given(
    context=st.integers(0, 40),
    new=st.integers(1, 6),
    cuts=st.lists(st.integers(0, 40), max_size=3),
    sink=st.tuples(st.floats(-4, 6), st.floats(-4, 6)),
)
def test_the_sink_on_the_new_token_call_alone_is_right_for_any_chunking(context, new, cuts, sink):
    """Any context length (0 included: a context-free row in the extend region), any chunking
    (chunks with no keys included): with the sink on the new-token call only, the merged output
    is attention over the whole context plus the new tokens with the sink once."""
    q, k, v = _qkv(new, context + new)
    sinks = torch.tensor(sink)
    scale = 16**-0.5
    want, _ = reference_kernels.attend(q, k, v, scale, True, sink=sinks)
    edges = [0, *sorted(min(c, context) for c in cuts), context]
    states = [reference_kernels.attend(q, k[context:], v[context:], scale, True, sink=sinks)]
    states += [
        reference_kernels.attend(q, k[a:b], v[a:b], scale, False)
        for a, b in itertools.pairwise(edges)
    ]
    torch.testing.assert_close(_merge(states), want, atol=1e-5, rtol=1e-4)


def test_the_plugins_ops_pass_the_sink_to_the_new_token_call_only():
    """``sink_in_new_token_call_only`` on vLLM's own ``rocm_aiter_ops``: a call over other keys
    (a context chunk) runs without the sink, the call whose keys are the queries' own tokens
    (``cu_seqlens_k`` is ``cu_seqlens_q``) with it. Runs the real AITER kernel where it imports
    (ROCm), the reference elsewhere."""
    from vllm._aiter_ops import rocm_aiter_ops

    if not probe.takes_sinks():
        pytest.skip("this release's ROCM_AITER_FA takes no attention sinks (no sink_ptr to pass)")
    ops = impl.sink_in_new_token_call_only(rocm_aiter_ops)
    assert issubclass(ops, rocm_aiter_ops)
    on_rocm = reference_kernels.aiter_available()
    device = torch.device("cuda" if on_rocm else "cpu")
    q, k, v = (t.half().to(device) for t in _qkv(6, 6, heads=2, kv_heads=2, d=64))
    offsets = torch.tensor([0, 2, 6], dtype=torch.int32, device=device)
    sink = torch.tensor([2.0, 3.0], device=device)

    def call(cls: type, own_keys: bool, sink_ptr: torch.Tensor | None) -> tuple:
        return cls.flash_attn_varlen_func(
            q=q, k=k, v=v, cu_seqlens_q=offsets,
            cu_seqlens_k=offsets if own_keys else offsets.clone(), max_seqlen_q=4,
            max_seqlen_k=4, min_seqlen_q=1, dropout_p=0.0, softmax_scale=0.125, causal=own_keys,
            window_size=(-1, -1), alibi_slopes=None, return_lse=True, sink_ptr=sink_ptr,
        )  # fmt: skip

    with reference_kernels.installed():
        for own_keys, vllm_sink in ((False, None), (True, sink)):
            got_out, got_lse = call(ops, own_keys, sink)
            want_out, want_lse = call(rocm_aiter_ops, own_keys, vllm_sink)
            torch.testing.assert_close(got_out, want_out)
            torch.testing.assert_close(got_lse, want_lse)
        _, lse_with_sink = call(rocm_aiter_ops, False, sink)
        _, lse_without = call(ops, False, sink)
        assert not torch.allclose(lse_with_sink, lse_without)


def _extend_forward_with_a_sink_on_every_call(self, attn_metadata, query, output):
    """Stands for vLLM 0.20.0-0.33.0: the new-token call and each context chunk's carry it."""
    chunks = attn_metadata.extend_metadata.chunk_context_metadata
    rocm_aiter_ops.flash_attn_varlen_func(q=query, return_lse=True, sink_ptr=self.sinks)
    for _ in range(chunks.num_chunks):
        cp_mha_gather_cache()
        rocm_aiter_ops.flash_attn_varlen_func(q=query, return_lse=True, sink_ptr=self.sinks)
        merge_attn_states()


def _extend_forward_with_the_sink_once(self, attn_metadata, query, output):
    """Stands for vLLM 0.34.0: the context chunks' calls pass ``sink_ptr=None``."""
    chunks = attn_metadata.extend_metadata.chunk_context_metadata
    rocm_aiter_ops.flash_attn_varlen_func(q=query, return_lse=True, sink_ptr=self.sinks)
    for _ in range(chunks.num_chunks):
        cp_mha_gather_cache()
        rocm_aiter_ops.flash_attn_varlen_func(q=query, return_lse=True, sink_ptr=None)
        merge_attn_states()


def _extend_forward_with_other_arguments(self, attn_metadata, prefix_tokens):
    rocm_aiter_ops.flash_attn_varlen_func(sink_ptr=self.sinks)
    cp_mha_gather_cache()
    merge_attn_states()


# The globals those stand-ins read, as vLLM's module has them (the probe replaces all three)
rocm_aiter_ops = cp_mha_gather_cache = merge_attn_states = None


def test_the_probe_tells_a_sink_counted_once_from_one_counted_per_call():
    """``vllm_counts_sink_once`` runs an extend path's code and counts the calls that carry the
    sink: once (vLLM 0.34.0) or once per call (0.20.0-0.33.0); None where that code cannot be run
    on its two-chunk batch (the plugin then keeps its change, right either way)."""
    assert impl.vllm_counts_sink_once(_extend_forward_with_the_sink_once) is True
    assert impl.vllm_counts_sink_once(_extend_forward_with_a_sink_on_every_call) is False
    assert impl.vllm_counts_sink_once(_extend_forward_with_other_arguments) is None


def test_the_probe_agrees_with_the_installed_vllms_code():
    """On the installed vLLM: the probe's answer is a definite one (its code runs that way)."""
    from vllm.v1.attention.backends.rocm_aiter_fa import AiterFlashAttentionImpl

    assert impl.vllm_counts_sink_once(AiterFlashAttentionImpl.extend_forward) in (True, False)


def _extend_forward_without_the_ops_global(self, attn_metadata):
    """Stands for a release whose extend path calls AITER other than through the global."""
    return attn_metadata


def test_an_extend_path_without_the_ops_global_is_left_as_vllms():
    """Where a release's ``extend_forward`` does not read ``rocm_aiter_ops`` as a global, the
    impl runs it unchanged (and says so) rather than failing a forward."""
    function = _extend_forward_without_the_ops_global
    assert impl._rebound(function, False, True) is function
