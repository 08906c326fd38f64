"""The forward cases (one list for the CPU tier, the MI300 tier, the demo and the doctor), how a
case becomes a real step, and the dense per-request reference its output is judged against.

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

if TYPE_CHECKING:
    from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm_rocm_aiter_plugin.diagnostics.model_runner import v1_order, v2_order

TOLERANCE = {"float16": 1e-2, "bfloat16": 6e-2}
"""Largest |output - reference| accepted for a request (outputs are O(1))."""
FP8_FORMATS = {"float8_e4m3fnuz": "MI300 (gfx942)", "float8_e4m3fn": "gfx950"}
"""The fp8 cache formats, and the GPUs whose ``fp8_dtype()`` each is."""


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
        """The requests in runner order (vLLM's own sort or reorder)."""
        by_id = {r.req_id: r for r in self.requests}
        tokens = {r.req_id: r.query_len for r in self.requests}
        if (order or self.order) == "v2":
            drafts = {r.req_id: [0] * r.num_drafts for r in self.requests if r.num_drafts}
            ids = v2_order(tokens, drafts, self.threshold)
        else:
            ids = v1_order(
                tokens,
                {r.req_id: r.context_len for r in self.requests},
                {r.req_id: r.prompt_tokens for r in self.requests},
                self.threshold,
            )
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
    from vllm.v1.attention.backend import CommonAttentionMetadata

    generator = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, case.dtype)
    bs = case.block_size
    query_lens = [r.query_len for r in requests] + [0] * case.num_padded_reqs
    seq_lens = [r.context_len + r.query_len for r in requests] + [0] * case.num_padded_reqs
    blocks_per_req = [-(-s // bs) for s in seq_lens]
    num_blocks = max(sum(blocks_per_req), 1)
    pool = torch.randperm(num_blocks, generator=generator).tolist()
    width = max([*blocks_per_req, 1])
    table = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    taken = 0
    for row, count in enumerate(blocks_per_req):
        table[row, :count] = torch.tensor(pool[taken : taken + count], dtype=torch.int32)
        taken += count

    def slots(row: int, start: int, end: int) -> torch.Tensor:
        positions = torch.arange(start, end)
        return table[row, positions // bs].long() * bs + positions % bs

    total = sum(query_lens)
    num_tokens = total + case.num_padding_tokens
    slot_mapping = torch.full((num_tokens,), -1, dtype=torch.int64)
    context_slots, context_rows, token_rows = [], [], []
    token, ctx_token = 0, 0
    for row, (q, s) in enumerate(zip(query_lens, seq_lens, strict=True)):
        slot_mapping[token : token + q] = slots(row, s - q, s)
        token_rows.append(slice(token, token + q))
        context_slots.append(slots(row, 0, s - q))
        context_rows.append(slice(ctx_token, ctx_token + s - q))
        token += q
        ctx_token += s - q
    offsets = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
    offsets[1:] = torch.cumsum(torch.tensor(query_lens, dtype=torch.int32), 0)
    seq = torch.tensor(seq_lens, dtype=torch.int32)

    fields = {f.name for f in dataclasses.fields(CommonAttentionMetadata)}
    extra: dict[str, Any] = {}
    if "seq_lens_cpu_upper_bound" in fields and case.with_upper_bound:
        extra["seq_lens_cpu_upper_bound"] = seq.clone()
    if not case.causal:
        if "causal" not in fields:
            raise NotImplementedError("this vLLM's CommonAttentionMetadata has no causal field")
        extra["causal"] = False
    batch = CommonAttentionMetadata(
        query_start_loc=offsets.to(device),
        query_start_loc_cpu=offsets,
        seq_lens=seq.to(device),
        num_reqs=len(query_lens),
        num_actual_tokens=num_tokens,
        max_query_len=case.max_query_len or max(query_lens, default=0),
        max_seq_len=max(seq_lens, default=0),
        block_table_tensor=table.to(device),
        slot_mapping=slot_mapping.to(device),
        **extra,
    )

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(dtype).to(device)

    num_context = ctx_token
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


# The case list. Threshold 1 unless spec_tokens says otherwise; heads 2, kv heads 1, head 64, fp16
# unless a case says otherwise (small, so that vLLM's Triton kernels stay quick in the
# interpreter). Context 20000 needs two workspace chunks once two rows share the workspace.
V2_EXAMPLE = (decode("decode", 900), prompt("new-prompt", 50), chunk("continuation", 8192, 800))
MULTI_CHUNK = (
    decode("decode", 900),
    prompt("new-prompt", 50),
    chunk("continuation-a", 20000, 300),
    chunk("continuation-b", 17000, 200),
)
SIXTY_FOUR_PROMPTS = (
    *(prompt(f"prompt-{i:02d}", 2 + i % 5) for i in range(64)),
    chunk("continuation", 8192, 40),
)
EAGLE_MIXED = (
    decode("decode-a", 300, 4, 3),
    decode("decode-b", 77, 4, 3),
    decode("decode-c", 40, 2, 1),
    prompt("short-prompt", 2),
    prompt("prompt", 9),
    chunk("prefix-hit", 5000, 70),
    prompt("long-prompt", 120),
)
EAGLE_VERIFY = tuple(decode(f"decode-{i}", 60 + 13 * i, 4, 3) for i in range(4))
V1_MIXED = (
    decode("decode-a", 37),
    decode("decode-b", 1200),
    chunk("short-extend", 300, 1),
    chunk("extend-a", 700, 40),
    chunk("extend-b", 90, 17),
    prompt("prompt-a", 33),
    prompt("prompt-b", 8),
)

FP8_STEP = (decode("decode", 300), prompt("new-prompt", 40), chunk("continuation", 500, 60))
FP8_EAGLE = (
    decode("decode-a", 300, 4, 3),
    decode("decode-b", 77, 4, 3),
    prompt("prompt", 9),
    chunk("prefix-hit", 500, 30),
)
FP8_EAGLE_CASE = "eagle-mixed-v2-fp8-e4m3fnuz"
SINK_STEP = (decode("decode", 200), prompt("new-prompt", 20), chunk("continuation", 240, 40))
SINKS = (6.0, 6.5)  # about the log of these rows' softmax sums: the sink takes a large share
MULTI_CHUNK_SMALL = (
    prompt("new-prompt", 2),
    *(chunk(f"continuation-{i:02d}", 1, 3) for i in range(16)),
    chunk("long-context", 2000, 4),
)
"""A context-free row in a two-chunk extend region: 18 rows share the workspace, so the 2000
cached tokens of the last one come in two chunks."""

CASES: tuple[ForwardCase, ...] = (
    ForwardCase("v1-mixed", V1_MIXED, "v1", head_size=128, num_heads=4, num_kv_heads=2),
    ForwardCase("v2-example", V2_EXAMPLE, "v2", note="the README's example"),
    ForwardCase("v2-example-bf16", V2_EXAMPLE, "v2", dtype="bfloat16"),
    ForwardCase(
        "v2-context-20000",
        (decode("decode", 900), prompt("new-prompt", 50), chunk("continuation", 20000, 300)),
        "v2",
        note="the issue's NaN example: one context chunk per row once sized by rows with context",
    ),
    ForwardCase("multi-chunk-v1", MULTI_CHUNK, "v1"),
    ForwardCase(
        "multi-chunk-v2", MULTI_CHUNK, "v2", note="a context-free row in a 2-chunk extend region"
    ),
    ForwardCase("64-prompts-v2", SIXTY_FOUR_PROMPTS, "v2", note="chunks: 1, stock's formula 17"),
    ForwardCase("64-prompts-v1", SIXTY_FOUR_PROMPTS, "v1"),
    ForwardCase(
        "eagle-pure-decode-no-upper-bound",
        tuple(decode(f"decode-{i}", 40 + 31 * i, 4, 3) for i in range(5)),
        "v2",
        spec_tokens=3,
        with_upper_bound=False,
        note="the EAGLE crash of 0.20.0-0.23.0",
    ),
    ForwardCase(
        "eagle-drafts-padded",
        tuple(decode(f"draft-{i}", 100 + 7 * i) for i in range(5)),
        "v2",
        spec_tokens=3,
        with_upper_bound=False,
        max_query_len=1,
        num_padded_reqs=3,
        note="model-runner V2's EAGLE draft step: padded requests, no upper bound",
    ),
    ForwardCase(
        "eagle-verify-padded",
        EAGLE_VERIFY,
        "v2",
        spec_tokens=3,
        num_padded_reqs=3,
        note="EAGLE verification with model-runner V2's padded requests (no keys, no queries)",
    ),
    ForwardCase(
        "eagle-verify-padded-bf16",
        EAGLE_VERIFY,
        "v2",
        spec_tokens=3,
        num_padded_reqs=3,
        dtype="bfloat16",
        note="the same in bf16 (AITER's Triton kernel runs widened to fp32 under the interpreter)",
    ),
    ForwardCase(
        "eagle-verify-sliding-window",
        EAGLE_VERIFY,
        "v2",
        spec_tokens=3,
        sliding_window=32,
        note="EAGLE verification under a sliding window shorter than every context",
    ),
    ForwardCase("eagle-mixed-v2", EAGLE_MIXED, "v2", spec_tokens=3),
    ForwardCase(
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
    ),
    ForwardCase("v2-padding-tokens", V2_EXAMPLE, "v2", num_padding_tokens=5),
    ForwardCase(
        "doctor-multi-chunk-v2",
        MULTI_CHUNK_SMALL,
        "v2",
        note="a new prompt in a two-chunk extend region, small enough for the doctor",
    ),
    # Model-runner V2 order at the other head sizes, block sizes and GQA ratios ROCM_AITER_FA
    # serves (64/128/256, 16/32; 1 to 8 query heads per KV head): a decode, a new prompt, then
    # rows with context, EAGLE's verification among them where AITER's Triton kernel runs.
    *(
        ForwardCase(
            f"v2-head{head}-block32-gqa{8 // kv_heads}",
            (decode("decode", ctx), prompt("new-prompt", new), chunk("continuation", *cont)),
            "v2",
            head_size=head,
            num_heads=8,
            num_kv_heads=kv_heads,
            block_size=32,
        )
        for head, kv_heads, ctx, new, cont in (
            (128, 2, 300, 40, (400, 60)),
            (256, 1, 200, 24, (300, 40)),
        )
    ),
    ForwardCase(
        "eagle-mixed-v2-head128-block32-mha",
        (*EAGLE_MIXED[:2], *EAGLE_MIXED[3:5], chunk("prefix-hit", 500, 30)),
        "v2",
        spec_tokens=3,
        head_size=128,
        num_heads=2,
        num_kv_heads=2,
        block_size=32,
        note="GQA ratio 1 (multi-head attention), EAGLE verification through unified_attention",
    ),
    ForwardCase("sliding-window-v2", V2_EXAMPLE, "v2", sliding_window=256),
    ForwardCase("sliding-window-v1", V2_EXAMPLE, "v1", sliding_window=256),
    ForwardCase(
        "v2-non-causal",
        (*FP8_STEP, prompt("prompt-b", 12)),
        "v2",
        causal=False,
        note="a non-causal batch (0.33): stock's regions, so context-free rows stay in prefill",
    ),
    # fp8 KV caches (--kv-cache-dtype fp8) in both formats, with scales that are not 1, some small
    # enough that the cache write saturates (where torch's own cast to e4m3fnuz gives NaN)
    ForwardCase(
        "v2-fp8-e4m3fnuz",
        FP8_STEP,
        "v2",
        kv_cache_dtype="fp8",
        fp8_format="float8_e4m3fnuz",
        k_scale=0.01,
        v_scale=0.08,
        note="MI300's format; k saturates past 2.4",
    ),
    ForwardCase(
        "v2-fp8-e4m3fn",
        FP8_STEP,
        "v2",
        kv_cache_dtype="fp8",
        fp8_format="float8_e4m3fn",
        k_scale=0.05,
        v_scale=0.005,
        note="gfx950's format; v saturates past 2.24",
    ),
    ForwardCase(
        "v1-fp8-e4m3fnuz",
        FP8_STEP,
        "v1",
        kv_cache_dtype="fp8",
        k_scale=0.05,
        v_scale=0.08,
    ),
    ForwardCase(
        FP8_EAGLE_CASE,
        FP8_EAGLE,
        "v2",
        spec_tokens=3,
        kv_cache_dtype="fp8",
        k_scale=0.05,
        v_scale=0.08,
        note="EAGLE verification: AITER's unified_attention on the fp8 caches",
    ),
    ForwardCase(
        "sliding-window-v2-fp8-e4m3fn",
        FP8_STEP,
        "v2",
        sliding_window=64,
        kv_cache_dtype="fp8",
        fp8_format="float8_e4m3fn",
        k_scale=0.05,
        v_scale=0.08,
        note="moved prompts read their own tokens back through fp8 under a window",
    ),
    # The shuffle KV-cache layout (VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=1, gfx950 images): the
    # plugin's builder runs vLLM's build() code there; vLLM's shuffle write and gather, AITER's
    # paged_attention_common for decodes. One query token per decode (the layout refuses EAGLE's
    # multi-token decodes and sliding windows).
    ForwardCase(
        "v2-shuffle-fp8-e4m3fnuz",
        FP8_STEP,
        "v2",
        kv_cache_dtype="fp8",
        k_scale=0.05,
        v_scale=0.08,
        kv_cache_layout="SHUFFLE",
        note="the shuffle layout on an fp8 cache, MI300's format",
    ),
    ForwardCase(
        "v1-shuffle-fp8-e4m3fn",
        FP8_STEP,
        "v1",
        kv_cache_dtype="fp8",
        fp8_format="float8_e4m3fn",
        k_scale=0.05,
        v_scale=0.08,
        kv_cache_layout="SHUFFLE",
        note="the shuffle layout on an fp8 cache, gfx950's format",
    ),
    ForwardCase(
        "v2-shuffle-bf16-head128",
        (decode("decode", 200), prompt("new-prompt", 24), chunk("continuation", 300, 40)),
        "v2",
        dtype="bfloat16",
        head_size=128,
        num_heads=4,
        num_kv_heads=2,
        kv_cache_layout="SHUFFLE",
        note="the shuffle layout on a 16-bit cache",
    ),
    ForwardCase(
        "multi-chunk-v2-shuffle-fp8",
        MULTI_CHUNK_SMALL,
        "v2",
        kv_cache_dtype="fp8",
        k_scale=0.05,
        v_scale=0.08,
        kv_cache_layout="SHUFFLE",
        note="the shuffle layout's gather in a two-chunk extend region with a context-free row",
    ),
    # Attention sinks (gpt-oss: one learned logit per query head in every softmax), sized to take
    # a visible share of these contexts' softmax: counted twice, a row is off by far more than the
    # tolerance. Decodes take AITER's unified_attention (the paged kernels have no sinks).
    ForwardCase("v2-sinks", SINK_STEP, "v2", sinks=SINKS, note="gpt-oss's sinks, V2 order"),
    ForwardCase(
        "v1-sinks",
        SINK_STEP,
        "v1",
        sinks=SINKS,
        note="V1 order: stock's extend path counts the sink once per call",
    ),
    ForwardCase(
        "multi-chunk-v2-sinks",
        MULTI_CHUNK,
        "v2",
        sinks=(6.0, 10.5),  # the second head's sink weighs in on rows with 20000 cached tokens
        note="a context-free row in a two-chunk extend region, with sinks",
    ),
    ForwardCase(
        "sliding-window-v2-sinks",
        SINK_STEP,
        "v2",
        sliding_window=64,
        sinks=SINKS,
        note="gpt-oss's sliding-window layers: the extend path is one call there",
    ),
)

CASES_BY_NAME = {case.name: case for case in CASES}
DOCTOR_CASE = "doctor-multi-chunk-v2"
DOCTOR_EAGLE_CASE = "eagle-pure-decode-no-upper-bound"
"""The doctor's second step: EAGLE verification, which takes AITER's ``unified_attention``."""
DOCTOR_SINK_CASE = "v2-sinks"
"""The doctor's third step, where the release takes sinks: the plugin gives AITER the sink on the
causal new-token call only, so a kernel that drops it there makes this step wrong."""
DOCTOR_SHUFFLE_DECODE_CASE = "doctor-decode-v2"
"""The doctor's second step in the shuffle KV-cache layout: the sink step's batch without sinks,
whose decode takes the layout's decode kernel."""


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
