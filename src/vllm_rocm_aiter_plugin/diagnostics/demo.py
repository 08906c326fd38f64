"""The main job on any machine: the three bugs and the fix on the installed vLLM (CPU is enough)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TextIO

from vllm_rocm_aiter_plugin.diagnostics import vllm_log

if TYPE_CHECKING:
    from vllm_rocm_aiter_plugin.diagnostics.forward.report import CaseResult


def run(out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    with vllm_log.held_back() as held:
        code, verdict = _report(out)
    print(file=out, flush=True)
    vllm_log.print_summary(held, err)
    print(verdict, file=out)
    return code


def _say(out: TextIO, label: str, value: object) -> None:
    print(f"  {label:<30} {value}", file=out)


def _report(out: TextIO) -> tuple[int, str]:
    import torch
    import vllm
    from vllm.plugins import load_general_plugins
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.backends.rocm_aiter_fa import AiterFlashAttentionMetadataBuilder

    from vllm_rocm_aiter_plugin import __version__, policy, releases
    from vllm_rocm_aiter_plugin.diagnostics.probe import check_builder_behaviour

    tested = f"{releases.OLDEST}-{releases.NEWEST}"
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
    stock = check_builder_behaviour(AiterFlashAttentionMetadataBuilder)
    plugin = check_builder_behaviour(backend.get_class().get_builder_cls())

    builds_ok = _builds(out, stock, plugin)
    forward_ok = _attention_output(out)
    if active and builds_ok and forward_ok:
        return 0, (
            "fix ACTIVE: ROCM_AITER_FA builds EAGLE pure-decode batches, and every request of "
            "the two steps above gets its true attention output, with no NaN"
        )
    if not active:
        return 1, "fix NOT active: ROCM_AITER_FA is not the plugin's (run the doctor)"
    return 1, "fix NOT working: the plugin failed above (run the doctor)"


def _builds(out: TextIO, stock: dict[str, Any], plugin: dict[str, Any]) -> bool:
    """Sections 1 and 2: vLLM's own split, then both builders' builds of the two batches the
    plugin exists for (``check_builder_behaviour``); whether the plugin's are right."""
    from vllm_rocm_aiter_plugin.diagnostics import probe, samples

    query, seq = samples.v2_order_lens()
    steps = ", ".join(f"{q} new + {s - q} cached" for q, s in zip(query, seq, strict=True))
    sections = (
        ("eagle_pure_decode", probe.probe_stock_split(),
         "1. The EAGLE crash. EAGLE's pure-decode batch as model-runner V2 builds it: 4 requests "
         "x 4 tokens (3 speculative), no seq_lens_cpu_upper_bound",
         "Bug 1 does not apply to this vLLM: its own split builds this batch."),
        ("v2_order", probe.probe_stock_v2_order(),
         "2. Cached context ignored. A model-runner V2 step in vLLM's own V2 order "
         f"(threshold 1): {steps}", None),
    )  # fmt: skip
    for name, split, title, not_applying in sections:
        print(f"\n{title}", file=out)
        _say(out, "vLLM's split", split.detail.removeprefix("stock split "))
        _say(out, "vLLM's builder", stock[name]["detail"])
        _say(out, "the plugin", plugin[name]["detail"])
        if not split.affected and not_applying:
            print(f"  {not_applying}", file=out)
    return all(plugin[name]["ok"] for name, *_ in sections)


def _attention_output(out: TextIO) -> bool:
    """Both steps through vLLM's real forward (one fresh process); each request's error."""
    import torch

    from vllm_rocm_aiter_plugin.diagnostics.forward import cases, runner
    from vllm_rocm_aiter_plugin.diagnostics.forward.report import ForwardRequest
    from vllm_rocm_aiter_plugin.diagnostics.model_runner import why_no_v1_order

    no_v1 = why_no_v1_order()
    bug_3 = cases.DEMO_BUG_3_V2_CASE if no_v1 else cases.DEMO_BUG_3_CASE
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"\n   Attention output, vLLM's real ROCM_AITER_FA forward on {device} (largest "
          "|output - reference| per request; the reference attends to the whole context):",
          file=out)  # fmt: skip
    try:
        report = runner.run_in_child(
            ForwardRequest([cases.DEMO_V2_CASE, bug_3], ["stock", "registered"], device)
        )
    except Exception as exc:
        print(f"   could not run: {type(exc).__name__}: {str(exc)[-300:]}", file=out)
        return False
    if report.unavailable:
        print(f"   could not run: {report.unavailable}", file=out)
        return False
    v2_case, bug_3_case = report.cases
    right = _output_table(out, v2_case)
    print(f"   (tolerance {v2_case.tolerance}; {report.kernels_line()})", file=out)

    rows = bug_3_case["stock"].rows
    steps = ", ".join(f"{r.query} new + {r.context} cached" for r in rows)
    if no_v1:
        print(f"\n3. NaN from empty context chunks. {no_v1[0].upper()}{no_v1[1:]}. A model-runner "
              f"V2 step (threshold 1): {steps}. The plugin's split puts the new prompt in an "
              f"extend region of {bug_3_case['registered'].chunks} context chunks, where it has "
              "no context to read.", file=out)  # fmt: skip
    else:
        print("\n3. NaN from empty context chunks. An EAGLE step (3 speculative tokens, threshold "
              f"4) in vLLM's own V1 order: {steps}. The 2-token new prompt lands in an extend "
              f"region of {bug_3_case['stock'].chunks} context chunks, where it has no context "
              "to read.", file=out)  # fmt: skip
    if report.facts is not None and not report.facts.merge_nan:
        print(f"  Bug 3 does not apply to vLLM {report.vllm}: its merge keeps two empty "
              "chunks finite.", file=out)  # fmt: skip
    return _output_table(out, bug_3_case) and right


def _output_table(out: TextIO, case: CaseResult) -> bool:
    """Stock's and the plugin's region and error per request; whether the plugin is right."""
    stock, plugin = case["stock"], case["registered"]
    for name, outcome in (("stock", stock), ("the plugin", plugin)):
        if outcome.error:
            print(f"   {name}: {outcome.error}", file=out)
    if stock.error or plugin.error:
        return False
    print(f"   {'request':<16} {'stock: region':>14} {'error':>14}   {'plugin: region':>15} "
          f"{'error':>14}", file=out)  # fmt: skip
    for stock_row, row in zip(stock.rows, plugin.rows, strict=True):
        cells = []
        for r in (stock_row, row):
            value = "NaN" if r.nan else f"{r.error:.4f}"
            cells.append((r.region, value + (" WRONG" if r.wrong(case.tolerance) else "")))
        print(f"   {row.req_id:<16} {cells[0][0]:>14} {cells[0][1]:>14}   {cells[1][0]:>15} "
              f"{cells[1][1]:>14}", file=out)  # fmt: skip
    return not plugin.wrong(case.tolerance)
