"""The forward tiers' cases: one list for the CPU, GPU and MI300 tiers, the commands' own steps
among them (``diagnostics/forward/cases.py``, which defines what a case is).
"""

from __future__ import annotations

from vllm_rocm_aiter_plugin.diagnostics.forward.cases import (
    DEMO_BUG_3_CASE,
    DEMO_BUG_3_V2_CASE,
    DEMO_V2_CASE,
    DOCTOR_CASE,
    DOCTOR_EAGLE_CASE,
    DOCTOR_SINK_CASE,
    FP8_CACHE,
    MULTI_CHUNK,
    MULTI_CHUNK_SMALL,
    SINK_STEP,
    SINKS,
    V2_EXAMPLE,
    ForwardCase,
    chunk,
    decode,
    prompt,
)

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
)

CASES_BY_NAME = {case.name: case for case in CASES}
