"""Markdown tables of the serving trace's results: printed by ``benchmarks/serving_trace.py`` and
written into the docs by cog (``bash scripts/nox -s docs``). Standard library only."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _or_na(value: object) -> str:
    return "n/a (no V1 runner)" if value is None else str(value)


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def trace_table(rows: Sequence[Mapping[str, Any]], machine: Mapping[str, Any]) -> str:
    """Per workload: steps where stock drops context in V2 order, requests hit, build() time."""
    lines = [
        f"vLLM {machine['vllm']} Scheduler, torch {machine['torch']}, {machine['cpu']}; "
        f"model-runner V2 order from {machine['v2_order']}; threshold 1 (no speculation).",
        "",
        "| workload | steps | mixed steps | stock drops context: steps (% of mixed) | plugin | "
        "V1 order, stock | requests | requests hit (stock) | requests hit (plugin) | "
        "build() stock s | build() plugin s | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['steps']} | {r['mixed_steps']} "
            f"| {r['stock_steps']} ({_pct(r['stock_steps'], r['mixed_steps'])}) "
            f"| {r['plugin_steps']} | {_or_na(r['v1_stock_steps'])} | {r['requests']} "
            f"| {r['stock_requests']} ({_pct(r['stock_requests'], r['requests'])}) "
            f"| {r['plugin_requests']} | {r['build_stock_s']:.3f} | {r['build_plugin_s']:.3f} "
            f"| {r['build_stock_s'] / r['build_plugin_s']:.1f}x |"
        )
    return "\n".join(lines)


def trace_forward_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Per workload, over the steps run through vLLM's forward: wrong and NaN requests for stock
    and the plugin in V2 order, and context chunks, stock in V1 order against the plugin in V2."""
    sampled = [r for r in rows if r.get("forward_steps")]
    if not sampled:
        return "(no step was run through the forward)"
    lines = [
        "| workload | steps run | requests | stock wrong (V2) | stock NaN | plugin wrong (V2) | "
        "plugin NaN | context chunks, total: stock V1 / plugin V2 | steps where plugin > stock V1 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sampled:
        pairs = [
            (plugin, v1)
            for plugin, v1 in zip(r["plugin_chunks"], r["v1_stock_chunks"], strict=True)
            if isinstance(v1, int) and isinstance(plugin, int)
        ]
        more = sum(1 for plugin, v1 in pairs if plugin > v1)
        lines.append(
            f"| {r['workload']} | {r['forward_steps']} | {r['forward_requests']} "
            f"| {r['stock_wrong']} | {r['stock_nan']} | {r['plugin_wrong']} | {r['plugin_nan']} "
            f"| {sum(v1 for _, v1 in pairs)} / {sum(p for p, _ in pairs)} | {more} |"
        )
    return "\n".join(lines)
