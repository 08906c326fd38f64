"""What a forward case is, how it becomes a real step, the dense per-request reference its output
is judged against, and the doctor's and the demo's own steps.

A case is a set of requests as the scheduler hands them over (cached tokens, tokens scheduled
now, draft tokens, prompt length), the runner order to lay them out in (``v2``: model-runner V2,
the installed vLLM's own sort; ``v1``: vLLM's V1 reorder) and the configuration it is served in
(KV-cache dtype and scales, head and block size, heads, sliding window, causal or not). The
reference for a request is plain attention over its whole context plus its own new tokens
(causal unless the case is not; sliding window where set), in float32, from the very K/V values
written into the cache: it never reads the cache or any metadata.

With an fp8 cache, the reference reads through fp8 exactly the K/V the kernels read from the
cache (:func:`reads_cache`): every row's context, and a row's own new tokens where its path reads
them back from the cache (decode rows; extend rows under a sliding window). Rounded that way, the
remaining difference is the kernels' 16-bit arithmetic, as with a 16-bit cache, so the tolerance
is the dtype's; a kernel or reference that drops a scale is off by far more.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from vllm_rocm_aiter_plugin.diagnostics.forward.reference_kernels import (
    attend,
    dequantise,
    quantise,
)
from vllm_rocm_aiter_plugin.diagnostics.model_runner import v1_order, v2_order

if TYPE_CHECKING:
    from vllm.v1.attention.backend import CommonAttentionMetadata

TOLERANCE = {"float16": 1e-2, "bfloat16": 6e-2}
"""Largest |output - reference| accepted for a request (outputs are O(1))."""


@dataclass(frozen=True)
class Request:
    """One scheduled request: cached tokens, tokens scheduled now, draft tokens among them, and
    its prompt length (a request whose context covers its prompt is decoding)."""

    req_id: str
    context_len: int
    query_len: int
    num_drafts: int = 0
    prompt_len: int | None = None  # None: the prompt is done (a decode)

    @property
    def prompt_tokens(self) -> int:
        return self.context_len if self.prompt_len is None else self.prompt_len


def decode(req_id: str, context: int, query: int = 1, drafts: int = 0) -> Request:
    return Request(req_id, context, query, drafts)


def prompt(req_id: str, query: int) -> Request:
    """A new prompt scheduled whole: no context."""
    return Request(req_id, 0, query, prompt_len=query)


def chunk(req_id: str, context: int, query: int) -> Request:
    """The next chunk of a long prompt, or a prompt whose prefix was cached: it has context."""
    return Request(req_id, context, query, prompt_len=context + query + 1)


@dataclass(frozen=True)
class ForwardCase:
    name: str
    requests: tuple[Request, ...]
    order: str  # "v2" or "v1"
    spec_tokens: int = 0
    sliding_window: int | None = None
    dtype: str = "float16"
    head_size: int = 64
    num_heads: int = 2
    num_kv_heads: int = 1
    block_size: int = 16
    num_padded_reqs: int = 0  # zero-length requests appended (model-runner V2, CUDA graphs)
    num_padding_tokens: int = 0  # num_actual_tokens past the last offset (CUDA-graph padding)
    with_upper_bound: bool = True
    max_query_len: int | None = None  # what the runner passes (EAGLE's drafts pass 1)
    kv_cache_dtype: str = "auto"  # as ``--kv-cache-dtype`` spells it
    fp8_format: str = "float8_e4m3fnuz"  # the platform's fp8_dtype(), where the cache is fp8
    k_scale: float = 1.0
    v_scale: float = 1.0
    causal: bool = True  # CommonAttentionMetadata.causal (0.33 builds non-causal batches)
    kv_cache_layout: str = "NHD"  # "SHUFFLE": VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=1
    sinks: tuple[float, ...] = ()  # one attention-sink logit per query head (gpt-oss); () none
    note: str = ""

    @property
    def shuffle(self) -> bool:
        return self.kv_cache_layout == "SHUFFLE"

    @property
    def fp8(self) -> bool:
        return self.kv_cache_dtype.startswith("fp8")

    @property
    def fp8_dtype(self) -> torch.dtype | None:
        return getattr(torch, self.fp8_format) if self.fp8 else None

    def sink_tensor(self, device: torch.device) -> torch.Tensor | None:
        """The layer's sinks as vLLM hands them to the impl (float32, one per query head)."""
        if not self.sinks:
            return None
        assert len(self.sinks) == self.num_heads, f"{self.name}: one sink per query head"
        return torch.tensor(self.sinks, dtype=torch.float32, device=device)

    @property
    def threshold(self) -> int:
        return 1 + self.spec_tokens

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> ForwardCase:
        requests = tuple(Request(**r) for r in data["requests"])
        return cls(**{**data, "requests": requests, "sinks": tuple(data.get("sinks", ()))})

    def ordered(self, order: str | None = None) -> list[Request]:
        """The requests in runner order (:func:`in_order`)."""
        return in_order(self.requests, order or self.order, self.threshold)


def in_order(requests: Sequence[Request], order: str, threshold: int) -> list[Request]:
    """``requests`` in the order a runner lays them out: model-runner V2's own sort (``v2``) or
    vLLM's V1 reorder (``v1``)."""
    by_id = {r.req_id: r for r in requests}
    tokens = {r.req_id: r.query_len for r in requests}
    if order == "v2":
        drafts = {r.req_id: [0] * r.num_drafts for r in requests if r.num_drafts}
        ids = v2_order(tokens, drafts, threshold)
    else:
        computed = {r.req_id: r.context_len for r in requests}
        ids = v1_order(tokens, computed, {r.req_id: r.prompt_tokens for r in requests}, threshold)
    return [by_id[i] for i in ids]


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
        num_padding_tokens=case.num_padding_tokens, max_query_len=case.max_query_len,
        block_size=bs, block_table=table, causal=case.causal,
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


# The commands' steps (the doctor's and the demo's; the tiers' whole list is
# ``tests/helpers/forward_cases.py``). Threshold 1 unless spec_tokens says otherwise; heads 2, kv
# heads 1, head 64, fp16: small, so that vLLM's Triton kernels stay quick in the interpreter.
V2_EXAMPLE = (decode("decode", 900), prompt("new-prompt", 50), chunk("continuation", 8192, 800))
MULTI_CHUNK = (
    decode("decode", 900),
    prompt("new-prompt", 50),
    chunk("continuation-a", 20000, 300),
    chunk("continuation-b", 17000, 200),
)
"""Context 20000 needs two workspace chunks once two rows share the workspace."""
MULTI_CHUNK_SMALL = (
    prompt("new-prompt", 2),
    *(chunk(f"continuation-{i:02d}", 1, 3) for i in range(16)),
    chunk("long-context", 2000, 4),
)
"""A context-free row in a two-chunk extend region: 18 rows share the workspace, so the 2000
cached tokens of the last one come in two chunks."""
SINK_STEP = (decode("decode", 200), prompt("new-prompt", 20), chunk("continuation", 240, 40))
SINKS = (6.0, 6.5)  # about the log of these rows' softmax sums: the sink takes a large share

DEMO_V2_CASE = ForwardCase("v2-example", V2_EXAMPLE, "v2", note="the README's example")
DEMO_BUG_3_CASE = ForwardCase(
    "v1-eagle-short-prompt-multi-chunk",
    (
        decode("decode", 300, 4, 3),
        chunk("continuation-a", 20000, 40),
        chunk("continuation-b", 17000, 30),
        prompt("short-prompt", 2),
        prompt("prompt", 60),
    ),
    "v1",
    spec_tokens=3,
    note="V1 order can put a context-free short prompt in a multi-chunk extend region too",
)
DEMO_BUG_3_V2_CASE = ForwardCase(
    "multi-chunk-v2", MULTI_CHUNK, "v2", note="a context-free row in a 2-chunk extend region"
)
"""The demo's section 3 where the installed vLLM has no V1 runner."""
DOCTOR_CASE = ForwardCase(
    "doctor-multi-chunk-v2",
    MULTI_CHUNK_SMALL,
    "v2",
    note="a new prompt in a two-chunk extend region, small enough for the doctor",
)
DOCTOR_EAGLE_CASE = ForwardCase(
    "eagle-pure-decode-no-upper-bound",
    tuple(decode(f"decode-{i}", 40 + 31 * i, 4, 3) for i in range(5)),
    "v2",
    spec_tokens=3,
    with_upper_bound=False,
    note="the EAGLE crash of 0.20.0-0.23.0",
)
"""The doctor's second step: EAGLE verification, which takes AITER's ``unified_attention``."""
DOCTOR_SINK_CASE = ForwardCase(
    "v2-sinks", SINK_STEP, "v2", sinks=SINKS, note="gpt-oss's sinks, V2 order"
)
"""The doctor's third step, where the release takes sinks: the plugin gives AITER the sink on the
causal new-token call only, so a kernel that drops it there makes this step wrong."""
DOCTOR_SHUFFLE_DECODE_CASE = "doctor-decode-v2"
"""The doctor's second step in the shuffle KV-cache layout: the sink step's batch without sinks,
whose decode takes the layout's decode kernel."""


FP8_CACHE = {"kv_cache_dtype": "fp8", "k_scale": 0.05, "v_scale": 0.08}
"""An fp8 KV cache with scales that are not 1, as a checkpoint's are (the doctor's and the tiers')."""


@dataclass(frozen=True)
class ServingConfiguration:
    """The operator's configuration the forward check runs in, as ``vllm serve`` spells it
    (``--kv-cache-dtype``, ``--block-size``, ``--head-size`` of the model); None: the case's."""

    kv_cache_dtype: str | None = None
    block_size: int | None = None
    head_size: int | None = None
    kv_cache_layout: str | None = None  # "SHUFFLE": VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT is on

    def changes(self, device: str) -> dict[str, Any]:
        """The forward cases' fields this configuration sets. An fp8 cache takes the format of
        the GPU it runs on (``current_platform.fp8_dtype()``), on CPU MI300's, with scales that
        are not 1, as a checkpoint's are."""
        changes: dict[str, Any] = {}
        for name in ("block_size", "head_size", "kv_cache_dtype"):
            if getattr(self, name) is not None:
                changes[name] = getattr(self, name)
        if self.kv_cache_dtype not in (None, "auto"):
            fp8_format = "float8_e4m3fnuz"
            if device != "cpu":
                from vllm.platforms import current_platform

                fp8_format = str(current_platform.fp8_dtype()).removeprefix("torch.")
            changes = {**FP8_CACHE, **changes, "fp8_format": fp8_format}
        if self.kv_cache_layout is not None:
            changes["kv_cache_layout"] = self.kv_cache_layout
        return changes


def doctor_steps(configuration: ServingConfiguration | None, device: str) -> list[ForwardCase]:
    """The forward check's steps: a model-runner V2 step whose extend region holds a new prompt
    and two context chunks; an EAGLE verification step without the upper bound (its decode path
    calls AITER's ``unified_attention``); where this release's ROCM_AITER_FA takes attention
    sinks, a V2 step with sinks, whose extend path relies on how AITER counts a sink on the causal
    new-token call. In the operator's ``configuration`` where one is given. In the shuffle
    KV-cache layout, where vLLM serves no EAGLE verification and no sinks, the first step and the
    sink step's batch without sinks: its decode takes the layout's own decode kernel."""
    from vllm_rocm_aiter_plugin.diagnostics import probe

    configuration = configuration or ServingConfiguration()
    if configuration.kv_cache_layout == "SHUFFLE" and probe.shuffle_layout_unavailable() == (
        probe.NO_SHUFFLE_LAYOUT
    ):
        configuration = dataclasses.replace(configuration, kv_cache_layout=None)  # vLLM ignores it
    if configuration.kv_cache_layout == "SHUFFLE":
        decode_step = dataclasses.replace(
            DOCTOR_SINK_CASE, name=DOCTOR_SHUFFLE_DECODE_CASE, sinks=()
        )
        steps = [DOCTOR_CASE, decode_step]
    else:
        steps = [DOCTOR_CASE, DOCTOR_EAGLE_CASE]
        steps += [DOCTOR_SINK_CASE] * probe.takes_sinks()
    changes = configuration.changes(device)
    return [dataclasses.replace(case, **changes) for case in steps]


def configuration(case: ForwardCase) -> dict[str, Any]:
    """What a case is served in, as an operator would name it."""
    return {
        "dtype": case.dtype,
        "kv_cache_dtype": case.kv_cache_dtype,
        "fp8_format": case.fp8_format if case.fp8 else None,
        "k_scale": case.k_scale,
        "v_scale": case.v_scale,
        "head_size": case.head_size,
        "block_size": case.block_size,
        "gqa": case.num_heads // case.num_kv_heads,
        "sliding_window": case.sliding_window,
        "causal": case.causal,
        "kv_cache_layout": case.kv_cache_layout,
        "sinks": bool(case.sinks),
        "eagle": bool(case.spec_tokens),
    }
