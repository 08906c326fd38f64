"""The one catalogue of forward cases, and what a case is: the batch type of every check.

A case is a set of requests as the scheduler hands them over (cached tokens, tokens scheduled
now, draft tokens, prompt length), the runner order to lay them out in (``v2``: model-runner V2,
the installed vLLM's own sort; ``v1``: vLLM's V1 reorder; ``given``: as listed, a batch already in
a runner's region order) and the configuration it is served in (KV-cache dtype and scales, head
and block size, heads, sliding window, causal or not). ``CASES`` holds every case the doctor
(``--all-cases``; its own steps: :func:`doctor_steps`), the demo and the test tiers run; the
hypothesis strategies of the tests draw more. This module imports neither torch nor vLLM: how a
case becomes a real step and its reference is ``steps.py``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

TOLERANCE = {"float16": 1e-2, "bfloat16": 6e-2}
"""Largest |output - reference| accepted for a request (outputs are O(1))."""


@dataclass(frozen=True)
class Request:
    """One scheduled request: cached tokens, tokens scheduled now, draft tokens among them, its
    prompt length (a request whose context covers its prompt is decoding), and how far the
    runner's ``seq_lens_cpu_upper_bound`` overstates its sequence (async speculative decoding)."""

    req_id: str
    context_len: int
    query_len: int
    num_drafts: int = 0
    prompt_len: int | None = None  # None: the prompt is done (a decode)
    upper_bound_slack: int = 0

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
    order: str  # "v2", "v1" or "given"
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
    graph_replay: bool = False  # also captured and replayed as a CUDA graph runs it (the tiers)
    note: str = ""

    @property
    def shuffle(self) -> bool:
        return self.kv_cache_layout == "SHUFFLE"

    @property
    def fp8(self) -> bool:
        return self.kv_cache_dtype.startswith("fp8")

    @property
    def fp8_dtype(self) -> torch.dtype | None:
        import torch

        return getattr(torch, self.fp8_format) if self.fp8 else None

    def sink_tensor(self, device: torch.device) -> torch.Tensor | None:
        """The layer's sinks as vLLM hands them to the impl (float32, one per query head)."""
        if not self.sinks:
            return None
        import torch

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


# The catalogue. Threshold 1 unless spec_tokens says otherwise; heads 2, kv heads 1, head 64,
# fp16: small, so that vLLM's Triton kernels stay quick in the interpreter.
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


FP8_CACHE: dict[str, Any] = {"kv_cache_dtype": "fp8", "k_scale": 0.05, "v_scale": 0.08}
"""An fp8 KV cache with scales that are not 1, as a checkpoint's are (the doctor's and the tiers')."""


FP8_FORMATS = {"float8_e4m3fnuz": "MI300 (gfx942)", "float8_e4m3fn": "gfx950"}
"""The fp8 cache formats, and the GPUs whose ``fp8_dtype()`` each is."""

SIXTY_FOUR_PROMPTS = (
    *(prompt(f"prompt-{i:02d}", 2 + i % 5) for i in range(64)),
    chunk("continuation", 2048, 40),
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
CASES: tuple[ForwardCase, ...] = (
    ForwardCase("v1-mixed", V1_MIXED, "v1", head_size=128, num_heads=4, num_kv_heads=2),
    DEMO_V2_CASE,
    ForwardCase("v2-example-bf16", V2_EXAMPLE, "v2", dtype="bfloat16"),
    ForwardCase(
        "v2-context-20000",
        (decode("decode", 900), prompt("new-prompt", 50), chunk("continuation", 20000, 300)),
        "v2",
        note="the issue's NaN example: one context chunk per row once sized by rows with context",
    ),
    ForwardCase("multi-chunk-v1", MULTI_CHUNK, "v1"),
    DEMO_BUG_3_V2_CASE,
    ForwardCase("64-prompts-v2", SIXTY_FOUR_PROMPTS, "v2", note="chunks: 1, stock's formula 5"),
    ForwardCase("64-prompts-v1", SIXTY_FOUR_PROMPTS, "v1"),
    DOCTOR_EAGLE_CASE,
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
    DEMO_BUG_3_CASE,
    ForwardCase("v2-padding-tokens", V2_EXAMPLE, "v2", num_padding_tokens=5),
    DOCTOR_CASE,
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
        **FP8_CACHE,
    ),
    ForwardCase(
        FP8_EAGLE_CASE,
        FP8_EAGLE,
        "v2",
        spec_tokens=3,
        **FP8_CACHE,
        note="EAGLE verification: AITER's unified_attention on the fp8 caches",
    ),
    ForwardCase(
        "sliding-window-v2-fp8-e4m3fn",
        FP8_STEP,
        "v2",
        sliding_window=64,
        **FP8_CACHE,
        fp8_format="float8_e4m3fn",
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
        **FP8_CACHE,
        kv_cache_layout="SHUFFLE",
        note="the shuffle layout on an fp8 cache, MI300's format",
    ),
    ForwardCase(
        "v1-shuffle-fp8-e4m3fn",
        FP8_STEP,
        "v1",
        **FP8_CACHE,
        fp8_format="float8_e4m3fn",
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
        **FP8_CACHE,
        kv_cache_layout="SHUFFLE",
        note="the shuffle layout's gather in a two-chunk extend region with a context-free row",
    ),
    # Attention sinks (gpt-oss: one learned logit per query head in every softmax), sized to take
    # a visible share of these contexts' softmax: counted twice, a row is off by far more than the
    # tolerance. Decodes take AITER's unified_attention (the paged kernels have no sinks).
    DOCTOR_SINK_CASE,
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
    # Uniform-decode steps a CUDA graph serves: the tiers also capture them and replay later
    # steps on the capture's metadata (tests/helpers/graph_replay.py).
    ForwardCase(
        "graph-replay-eagle-padded",
        EAGLE_VERIFY,
        "v2",
        spec_tokens=3,
        num_padded_reqs=3,
        graph_replay=True,
        note="EAGLE verification captured with padded requests, replayed on two later steps",
    ),
    ForwardCase(
        "graph-replay-decode-sliding-window",
        tuple(decode(f"decode-{i}", 60 + 13 * i) for i in range(4)),
        "v2",
        sliding_window=32,
        graph_replay=True,
        note="decodes under a sliding window: 0.33's builder writes their decode tables into "
        "its own buffers at every build",
    ),
)


CASES_BY_NAME = {case.name: case for case in CASES}


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
