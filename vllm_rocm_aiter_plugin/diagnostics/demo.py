"""The main job on any machine: show both bugs and the fix on the installed vLLM (CPU is enough).

1. EAGLE's pure-decode batch as model-runner V2 builds it (no ``seq_lens_cpu_upper_bound``), with
   an EAGLE config of 3 speculative tokens: vLLM's split and builder, and the registered builder.
2. A model-runner V2 step (decode, new prompt, continuation with 8192 cached tokens, in the
   installed vLLM's own V2 order): where each split puts each request, then vLLM's real
   ROCM_AITER_FA forward with stock's backend and the registered one, every request's output
   against plain attention over its whole context.
Exit 0 when ROCM_AITER_FA resolves to the plugin and it is right on both.

vLLM's own log lines are held back while the report prints and summarised on stderr at the end,
so that they do not interleave with it.
"""

from __future__ import annotations

import logging
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen: Counter[tuple[str, str]] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.seen[(record.levelname, record.getMessage().splitlines()[0])] += 1


@contextmanager
def _vllm_log_held_back(err: TextIO) -> Iterator[None]:
    """vLLM's log records (the plugin's included) are collected, then summarised on ``err``."""
    import vllm  # noqa: F401  (configures vLLM's logging)

    logger = logging.getLogger("vllm")
    collect = _Collect()
    saved = logger.handlers[:]
    logger.handlers = [collect]
    try:
        yield
    finally:
        logger.handlers = saved
        if collect.seen:
            print("\nvLLM's log while the demo ran (it does not change the results above):",
                  file=err)  # fmt: skip
            for (level, message), count in collect.seen.items():
                times = f" (x{count})" if count > 1 else ""
                print(f"  {level} {message}{times}", file=err)


def _counts(meta: Any) -> str:
    return (
        f"decodes {meta.num_decodes}, extends {meta.num_extends}, prefills {meta.num_prefills} "
        f"(decode tokens {meta.num_decode_tokens}, extend tokens {meta.num_extend_tokens})"
    )


def _build(builder_cls: type, config: Any, batch: Any) -> tuple[Any, str]:
    from vllm_rocm_aiter_plugin.diagnostics.probe import build_with

    try:
        meta = build_with(builder_cls, config, batch)
    except Exception as exc:
        return None, f"raises {type(exc).__name__}: {exc}".rstrip(": ")
    return meta, _counts(meta)


def run(out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    with _vllm_log_held_back(err):
        return _report(out)


def _report(out: TextIO) -> int:
    import torch
    import vllm
    from vllm.plugins import load_general_plugins
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.backends.rocm_aiter_fa import AiterFlashAttentionMetadataBuilder

    from vllm_rocm_aiter_plugin import __version__, policy
    from vllm_rocm_aiter_plugin.diagnostics import probe, samples
    from vllm_rocm_aiter_plugin.diagnostics.forward import runner

    def say(label: str, value: object) -> None:
        print(f"  {label:<30} {value}", file=out)

    tested = (
        f"{policy.format_version(policy.MIN_SUPPORTED_VLLM)}-"
        f"{policy.format_version(policy.NEWEST_TESTED_VLLM)}"
    )
    print(
        f"vllm-rocm-aiter-plugin {__version__} on vLLM {vllm.__version__} (tested {tested}: "
        f"{'yes' if policy.in_tested_range(vllm.__version__) else 'NO'}), torch {torch.__version__}",
        file=out,
    )
    load_general_plugins()
    backend = AttentionBackendEnum.ROCM_AITER_FA
    resolved = backend.get_path()
    active = resolved == policy.BACKEND_QUALNAME
    print(f"ROCM_AITER_FA resolves to {resolved} ({'the plugin' if active else 'NOT the plugin'})",
          file=out)  # fmt: skip
    registered_builder = backend.get_class().get_builder_cls()

    print("\n1. EAGLE pure-decode batch as model-runner V2 builds it: 4 requests x 4 tokens "
          "(3 speculative), no seq_lens_cpu_upper_bound", file=out)  # fmt: skip
    eagle_config = samples.tiny_vllm_config(num_speculative_tokens=3)
    eagle_batch = samples.eagle_decode_batch(num_reqs=4, num_speculative_tokens=3)
    split_probe = probe.probe_stock_split()
    say("vLLM's split", split_probe.detail.removeprefix("stock split "))
    say("vLLM's builder", _build(AiterFlashAttentionMetadataBuilder, eagle_config, eagle_batch)[1])
    eagle_meta, eagle_result = _build(registered_builder, eagle_config, eagle_batch)
    say("registered builder", eagle_result)
    eagle_ok = eagle_meta is not None and eagle_meta.num_decodes == eagle_batch.num_reqs

    query, seq = samples.v2_order_lens()
    steps = ", ".join(f"{q} new + {s - q} cached" for q, s in zip(query, seq, strict=True))
    print(f"\n2. Model-runner V2 step in vLLM's own V2 order (threshold 1): {steps}", file=out)
    v2_probe = probe.probe_stock_v2_order()
    say("vLLM's split", v2_probe.detail.removeprefix("stock split "))
    v2_config = samples.tiny_vllm_config()
    say("vLLM's builder", _build(AiterFlashAttentionMetadataBuilder, v2_config,
                                 samples.v2_order_batch())[1])  # fmt: skip
    v2_meta, v2_result = _build(registered_builder, v2_config, samples.v2_order_batch())
    say("registered builder", v2_result)

    forward_ok = _attention_output(out, runner)
    fixed = active and eagle_ok and v2_meta is not None and forward_ok
    if fixed:
        verdict = (
            "fix ACTIVE: ROCM_AITER_FA builds EAGLE pure-decode batches, and every request of "
            "the model-runner V2 step gets its true attention output"
        )
    elif not active:
        verdict = "fix NOT active: ROCM_AITER_FA is not the plugin's (run the doctor)"
    else:
        verdict = "fix NOT working: the registered backend failed above (run the doctor)"
    print(f"\n{verdict}", file=out)
    return 0 if fixed else 1


def _attention_output(out: TextIO, runner: Any) -> bool:
    """Run the step through vLLM's real forward (a fresh process); print each request's error."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"\n   Attention output, vLLM's real ROCM_AITER_FA forward on {device} (largest "
          "|output - reference| per request; the reference attends to the whole context):",
          file=out)  # fmt: skip
    try:
        report = runner.run_in_child(["v2-example"], kinds=("stock", "registered"), device=device)
    except Exception as exc:
        print(f"   could not run: {type(exc).__name__}: {str(exc)[-300:]}", file=out)
        return False
    if "unavailable" in report:
        print(f"   could not run: {report['unavailable']}", file=out)
        return False
    case = report["cases"][0]
    tolerance = case["tolerance"]
    results = {kind: case[kind] for kind in ("stock", "registered")}
    for kind, result in results.items():
        if "error" in result:
            print(f"   {kind}: {result['error']}", file=out)
    if any("error" in result for result in results.values()):
        return False
    print(f"   {'request':<14} {'stock: region':>14} {'error':>14}   {'registered: region':>19} "
          f"{'error':>14}", file=out)  # fmt: skip
    right = True
    for stock_row, row in zip(results["stock"]["rows"], results["registered"]["rows"], strict=True):
        cells = []
        for r in (stock_row, row):
            wrong = r["nan"] or r["error"] > tolerance
            value = "NaN" if r["nan"] else f"{r['error']:.4f}"
            cells.append((r["region"], value + (" WRONG" if wrong else "")))
        right = right and not (row["nan"] or row["error"] > tolerance)
        print(f"   {row['req_id']:<14} {cells[0][0]:>14} {cells[0][1]:>14}   {cells[1][0]:>19} "
              f"{cells[1][1]:>14}", file=out)  # fmt: skip
    kernels = (
        "AITER's kernels"
        if not report["references"]
        else "vLLM's Triton kernels; torch references for AITER's (no ROCm here)"
    )
    print(f"   (tolerance {tolerance}; {kernels})", file=out)
    return right
