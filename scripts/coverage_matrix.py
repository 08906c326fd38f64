"""The configuration coverage matrix of ``docs/testing.md``, generated from the forward cases."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # tests.helpers: the forward cases and the graph replay cases

from tests.helpers.forward_cases import CASES  # noqa: E402
from tests.helpers.graph_replay import REPLAY_CASES  # noqa: E402
from vllm_rocm_aiter_plugin import releases  # noqa: E402
from vllm_rocm_aiter_plugin.diagnostics.forward.cases import ForwardCase  # noqa: E402

PAGE = os.path.join(ROOT, "docs", "testing.md")
BLOCK = re.compile(r"(<!-- coverage matrix -->\n)(.*?)(<!-- end coverage matrix -->)", re.S)
MI300_NOT_RUN = "not verified: no MI300 run on record (the tier has the cases)"


def takes_v3_route(case: ForwardCase) -> bool:
    """Whether AITER would send the case's prefill and extend calls on an MI300 (gfx942) to its
    v3 assembly kernel rather than CK's ``mha_varlen_fwd``: ``can_impl_fmha_v3_fwd`` in
    ``_flash_attn_varlen_forward`` (``aiter/ops/mha.py``, amd-aiter 0.1.7.post2.dev18): bf16,
    head size 128 (192 on gfx950 only), no sliding window."""
    return case.dtype == "bfloat16" and case.head_size == 128 and case.sliding_window is None


Row = tuple[str, Callable[[ForwardCase], bool] | None, str]
"""(configuration, which cases are in it or None, and what a verified cell means where that needs
saying, or why no case covers it)."""

ROWS: tuple[Row, ...] = (
    ("KV cache auto, fp16", lambda c: not c.fp8 and c.dtype == "float16", ""),
    ("KV cache auto, bf16", lambda c: not c.fp8 and c.dtype == "bfloat16", ""),
    ("KV cache fp8, e4m3fnuz (MI300)", lambda c: c.fp8 and c.fp8_format == "float8_e4m3fnuz", ""),
    ("KV cache fp8, e4m3fn (gfx950)", lambda c: c.fp8 and c.fp8_format == "float8_e4m3fn", ""),
    ("head size 64", lambda c: c.head_size == 64, ""),
    ("head size 128", lambda c: c.head_size == 128, ""),
    ("head size 256", lambda c: c.head_size == 256, ""),
    ("block size 16", lambda c: c.block_size == 16, ""),
    ("block size 32", lambda c: c.block_size == 32, ""),
    *(
        (f"GQA ratio {ratio}", (lambda c, r=ratio: c.num_heads // c.num_kv_heads == r), "")
        for ratio in (1, 2, 4, 8)
    ),
    ("sliding window", lambda c: c.sliding_window is not None, ""),
    ("EAGLE (query > 1 decodes)", lambda c: c.spec_tokens > 0, ""),
    ("model-runner V2 order", lambda c: c.order == "v2", ""),
    (
        "non-causal batch",
        lambda c: not c.causal,
        "context-free rows equal their reference; rows with context equal stock's",
    ),
    (
        "shuffle KV layout",
        lambda c: c.shuffle,
        "the plugin's builder runs vLLM's build() code; vLLM's shuffle write and gather run",
    ),
    (
        "prefill and extend on AITER's CK route (MI300)",
        lambda c: not takes_v3_route(c),
        "the references compute what CK's mha_varlen_fwd computes",
    ),
    (
        "prefill and extend on AITER's v3 assembly route (MI300: bf16, head size 128)",
        takes_v3_route,
        "the references compute what CK computes; on an MI300 these calls take the assembly "
        "kernel, which only the MI300 tier runs",
    ),
    (
        "attention sinks",
        lambda c: bool(c.sinks),
        "each row's softmax counts the sink once (stock's extend merges count it once per call)",
    ),
    (
        "attention sinks on AITER's v3 assembly route",
        lambda c: bool(c.sinks) and takes_v3_route(c),
        "no case: AITER gives that route no sink, so stock and the plugin both drop it "
        "(docs/upstream/aiter.md, finding 5)",
    ),
    (
        GRAPH_ROW := "CUDA-graph capture and replay",
        lambda c: True,
        "the capture's metadata replays later steps written into the persistent inputs (an eager "
        "stand-in for the graph, which needs a GPU; the MI300 tier captures a real one)",
    ),
)
POOLS: dict[str, tuple[ForwardCase, ...]] = {GRAPH_ROW: REPLAY_CASES}
"""Rows whose cases are not the forward cases (``tests/helpers/graph_replay.py``)."""


def _facts(release: str) -> dict[str, object]:
    """What compat's run of the doctor found the release doing (``compat/results.json``)."""
    with open(os.path.join(ROOT, "compat", "results.json")) as f:
        (row,) = [r for r in json.load(f) if r["vllm"] == release]
    return row["facts"]


def _why_not(case: ForwardCase, facts: dict[str, object]) -> str | None:
    if case.order == "v1" and facts["no_v1_runner"]:
        return "this release has no V1 model runner"
    if case.sinks and not facts["takes_sinks"]:
        return "this release's ROCM_AITER_FA takes no attention sinks"
    if not case.causal and not facts["non_causal_batches"]:
        return "this release's model-runner V2 builds causal batches only"
    if case.shuffle and facts["no_shuffle_layout"]:
        return "this release's shuffle layout interleaves K and V, which its decode cannot read"
    return None


def _cpu_cell(cases: list[ForwardCase], release: str, meaning: str) -> str:
    facts = _facts(release)
    runnable = [c for c in cases if _why_not(c, facts) is None]
    if not runnable:
        return f"n/a: {_why_not(cases[0], facts)}"
    if facts["counts_sink_once"] and "once per call" in meaning:
        meaning = (
            "each row's softmax counts the sink once (vLLM's own extend path does: the plugin "
            "steps aside)"
        )
    verified = f"verified ({len(runnable)} case{'s' * (len(runnable) > 1)})"
    return f"{verified}: {meaning}" if meaning else verified


def _mi300_cell(cases: list[ForwardCase]) -> str:
    if all(c.fp8 and c.fp8_format != "float8_e4m3fnuz" for c in cases):
        return "n/a: gfx942 reads fp8 as e4m3fnuz (a gfx950 runner would run these)"
    return MI300_NOT_RUN


def matrix() -> str:
    header = ["configuration", *(f"CPU forward, vLLM {r}" for r in releases.CI), "MI300 forward"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, selects, text in ROWS:
        cases = [c for c in POOLS.get(name, CASES) if selects(c)] if selects else []
        if cases and text.startswith("no case: "):
            raise ValueError(f"row {name!r} says no case covers it, but {len(cases)} do")
        if cases:
            cells = [*(_cpu_cell(cases, r, text) for r in releases.CI), _mi300_cell(cases)]
        else:
            cells = [f"not verified: {text.removeprefix('no case: ')}"] * (len(releases.CI) + 1)
        lines.append("| " + " | ".join([name, *cells]) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    with open(PAGE) as f:
        text = f.read()
    if not BLOCK.search(text):
        print(f"{PAGE} has no '<!-- coverage matrix -->' block", file=sys.stderr)
        return 1
    new = BLOCK.sub(lambda m: f"{m.group(1)}{matrix()}{m.group(3)}", text)
    if argv == ["--check"]:
        if new != text:
            print("docs/testing.md's coverage matrix is out of date: "
                  "python scripts/coverage_matrix.py", file=sys.stderr)  # fmt: skip
            return 1
        return 0
    with open(PAGE, "w") as f:
        f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
