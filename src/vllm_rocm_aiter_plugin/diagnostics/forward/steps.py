"""How a forward case becomes a real step: its requests in a runner's order, vLLM's
``CommonAttentionMetadata`` for them, the K/V written into the cache, and the dense per-request
reference its output is judged against.

The reference for a request is plain attention over its whole context plus its own new tokens
(causal unless the case is not; sliding window where set), in float32, from the very K/V values
written into the cache: it never reads the cache or any metadata. With an fp8 cache, it reads
through fp8 exactly the K/V the kernels read from the cache (:func:`reads_cache`): every row's
context, and a row's own new tokens where its path reads them back from the cache (decode rows;
extend rows under a sliding window). Rounded that way, the remaining difference is the kernels'
16-bit arithmetic, as with a 16-bit cache, so the tolerance is the dtype's; a kernel or reference
that drops a scale is off by far more.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from vllm_rocm_aiter_plugin.diagnostics.forward.cases import ForwardCase, Request
from vllm_rocm_aiter_plugin.diagnostics.forward.reference_kernels import (
    attend,
    dequantise,
    quantise,
)
from vllm_rocm_aiter_plugin.diagnostics.model_runner import v1_order, v2_order

if TYPE_CHECKING:
    from vllm.v1.attention.backend import CommonAttentionMetadata


def in_order(requests: Sequence[Request], order: str, threshold: int) -> list[Request]:
    """``requests`` in the order a runner lays them out: model-runner V2's own sort (``v2``),
    vLLM's V1 reorder (``v1``), or as listed (``given``: a batch already in a runner's order)."""
    if order == "given":
        return list(requests)
    by_id = {r.req_id: r for r in requests}
    tokens = {r.req_id: r.query_len for r in requests}
    if order == "v2":
        drafts = {r.req_id: [0] * r.num_drafts for r in requests if r.num_drafts}
        ids = v2_order(tokens, drafts, threshold)
    else:
        computed = {r.req_id: r.context_len for r in requests}
        ids = v1_order(tokens, computed, {r.req_id: r.prompt_tokens for r in requests}, threshold)
    return [by_id[i] for i in ids]


def slack_of(requests: Sequence[Request], case: ForwardCase) -> list[int]:
    """Each row's ``seq_lens_cpu_upper_bound`` overstatement, the padded requests' none."""
    return [r.upper_bound_slack for r in requests] + [0] * case.num_padded_reqs


def laid_out(
    case: ForwardCase, order: str | None = None
) -> tuple[list[int], list[int], CommonAttentionMetadata]:
    """Query and sequence lengths of ``case``'s requests in ``order`` (the case's own by default),
    its padded requests last, and their real ``CommonAttentionMetadata`` on the host (consecutive
    blocks): what the split and the builders are checked on."""
    from vllm_rocm_aiter_plugin.diagnostics.samples import make_batch

    requests = in_order(case.requests, order or case.order, case.threshold)
    query = [r.query_len for r in requests] + [0] * case.num_padded_reqs
    seq = [r.context_len + r.query_len for r in requests] + [0] * case.num_padded_reqs
    batch = make_batch(
        query, seq, with_upper_bound=case.with_upper_bound,
        upper_bound_slack=slack_of(requests, case), num_padding_tokens=case.num_padding_tokens,
        max_query_len=case.max_query_len, causal=case.causal,
    )  # fmt: skip
    return query, seq, batch


@dataclass
class StepTensors:
    """A step laid out for the kernels: the batch, the K/V values written into the cache, the
    new tokens' q/k/v, and where each request's rows are."""

    requests: list[Request]
    query_lens: list[int]
    seq_lens: list[int]
    batch: CommonAttentionMetadata
    num_blocks: int
    context_slots: torch.Tensor
    context_k: torch.Tensor
    context_v: torch.Tensor
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    context_rows: list[slice] = field(default_factory=list)  # per request, in context_k
    token_rows: list[slice] = field(default_factory=list)  # per request, in query


def lay_out(
    case: ForwardCase, requests: Sequence[Request], device: torch.device, seed: int = 0
) -> StepTensors:
    """The real ``CommonAttentionMetadata`` for ``requests`` in this order (blocks drawn at random
    from one pool, so a wrong block-table row cannot go unnoticed) and random q/k/v values."""
    from vllm_rocm_aiter_plugin.diagnostics.samples import make_batch, slots_of

    generator = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, case.dtype)
    bs = case.block_size
    query_lens = [r.query_len for r in requests] + [0] * case.num_padded_reqs
    seq_lens = [r.context_len + r.query_len for r in requests] + [0] * case.num_padded_reqs
    blocks_per_req = [-(-s // bs) for s in seq_lens]
    num_blocks = max(sum(blocks_per_req), 1)
    pool = torch.randperm(num_blocks, generator=generator).tolist()
    table = torch.zeros(len(seq_lens), max([*blocks_per_req, 1]), dtype=torch.int32)
    taken = 0
    for row, count in enumerate(blocks_per_req):
        table[row, :count] = torch.tensor(pool[taken : taken + count], dtype=torch.int32)
        taken += count
    batch = make_batch(
        query_lens, seq_lens, device=device, with_upper_bound=case.with_upper_bound,
        upper_bound_slack=slack_of(requests, case), num_padding_tokens=case.num_padding_tokens,
        max_query_len=case.max_query_len, block_size=bs, block_table=table, causal=case.causal,
    )  # fmt: skip
    context_slots, context_rows, token_rows = [], [], []
    token, ctx_token = 0, 0
    for row, (q, s) in enumerate(zip(query_lens, seq_lens, strict=True)):
        token_rows.append(slice(token, token + q))
        context_slots.append(slots_of(table[row], bs, 0, s - q))
        context_rows.append(slice(ctx_token, ctx_token + s - q))
        token += q
        ctx_token += s - q

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(dtype).to(device)

    num_context, num_tokens = ctx_token, batch.num_actual_tokens
    hk, h, d = case.num_kv_heads, case.num_heads, case.head_size
    return StepTensors(
        requests=list(requests),
        query_lens=query_lens,
        seq_lens=seq_lens,
        batch=batch,
        num_blocks=num_blocks,
        context_slots=torch.cat(context_slots).to(device) if context_slots else torch.empty(0),
        context_k=randn(num_context, hk, d),
        context_v=randn(num_context, hk, d),
        query=randn(num_tokens, h, d),
        key=randn(num_tokens, hk, d),
        value=randn(num_tokens, hk, d),
        context_rows=context_rows,
        token_rows=token_rows,
    )


def reads_cache(case: ForwardCase, region: str) -> bool:
    """Whether a row of ``region`` reads its own new tokens back from the KV cache: decode rows
    (``paged_attention_v1``, ``unified_attention``) and, under a sliding window, extend rows
    (``extend_for_sliding_window`` gathers context and new tokens from the cache). The prefill
    kernel and the extend path's new-token call take the new K/V as computed."""
    return region == "decode" or (region == "extend" and case.sliding_window is not None)


def as_cached(case: ForwardCase, values: torch.Tensor, scale: float) -> torch.Tensor:
    """``values`` as a kernel reads them back from this case's cache (float32): written through
    fp8 and multiplied by the scale where the cache is fp8 (divided in float32 by the shuffle
    layout's Triton write), as written where it is not."""
    if not case.fp8:
        return values.float()
    assert case.fp8_dtype is not None
    written = quantise(values, case.fp8_dtype, scale, float32_division=case.shuffle)
    return dequantise(written, scale)


def dense_reference(
    case: ForwardCase, step: StepTensors, row: int, region: str = "prefill"
) -> torch.Tensor:
    """Request ``row``'s true attention output, float32 [query_len, heads, head_size]: softmax
    over its keys (and the layer's sink, counted once); with an fp8 cache, what a row of
    ``region`` reads through the cache is rounded as the cache holds it."""
    ctx, tok = step.context_rows[row], step.token_rows[row]
    own_k, own_v = step.key[tok].float(), step.value[tok].float()
    if reads_cache(case, region):
        own_k, own_v = (
            as_cached(case, step.key[tok], case.k_scale),
            as_cached(case, step.value[tok], case.v_scale),
        )
    keys = torch.cat([as_cached(case, step.context_k[ctx], case.k_scale), own_k])
    values = torch.cat([as_cached(case, step.context_v[ctx], case.v_scale), own_v])
    window = (case.sliding_window - 1, 0) if case.sliding_window else (-1, -1)
    sink = case.sink_tensor(step.query.device)
    out, _ = attend(step.query[tok], keys, values, case.head_size**-0.5, case.causal, window, sink)
    return out
