"""What the doctor prints (:mod:`.doctor` runs the checks): a table ending with the verdict, or
with ``--json`` one JSON document with stable keys; vLLM's log, summed up, on stderr first."""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
from typing import Any, TextIO

from vllm_rocm_aiter_plugin.diagnostics.doctor import (
    DoctorReport,
    ForwardCheck,
    ServingConfiguration,
    collect,
    resolves_to_plugin,
)
from vllm_rocm_aiter_plugin.diagnostics.probe import ReleaseFacts


def run(
    as_json: bool = False,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    configuration: ServingConfiguration | None = None,
    all_cases: bool = False,
) -> int:
    """Collect the report (its forward check in ``configuration`` where given, and on every
    catalogue case with ``all_cases``), then print vLLM's log as :mod:`.vllm_log` sums it up
    (stderr), then the report (stdout)."""
    from vllm_rocm_aiter_plugin.diagnostics import vllm_log

    with vllm_log.held_back() as held:
        report = collect(configuration=configuration, all_cases=all_cases)
    vllm_log.print_summary(held, err)
    if as_json:
        print(to_json(report), file=out)
    else:
        render(report, out)
    return report.exit_code


def to_json(report: DoctorReport) -> str:
    return json.dumps(dataclasses.asdict(report), indent=2, sort_keys=True, default=_name)


def _name(value: Any) -> Any:
    """A value JSON has no word for: an enum member by its name (``Switch.ON``: ``"ON"``)."""
    return value.name if isinstance(value, enum.Enum) else str(value)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    return str(value)


def _rows(report: DoctorReport) -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = []
    v = report.versions
    if v is not None:
        in_range = _fmt(v.vllm_in_tested_range)
        rows.append(("plugin", v.plugin))
        rows.append(("vLLM", f"{v.vllm} (tested {'-'.join(v.vllm_tested_range)}: {in_range})"))
        rows.append(("torch", f"{v.torch} (HIP {_fmt(v.torch_hip)}, CUDA {_fmt(v.torch_cuda)})"))
        body = (
            f"the plugin's builder does not import here ({v.builder_error})"
            if v.builder_error
            else "the plugin's own build body runs (a verified build() source)"
            if v.own_build
            else "vLLM's build() code runs, with the plugin's split (a build() source the plugin "
            "has not verified, or switched off)"
        )
        rows.append(("ROCM_AITER_FA build()", f"{_fmt(v.vllm_build_fingerprint)}: {body}"))
    if "gpu" not in report.check_errors:
        gpu = report.gpu
        shown = "no GPU" if gpu is None else f"{gpu.name} ({gpu.arch}; MI300-class: "
        rows.append(("GPU", shown if gpu is None else f"{shown}{_fmt(gpu.mi300_class)})"))
    if report.aiter is not None:
        a = report.aiter
        error = f" ({a.error})" if a.error else ""
        rows.append(
            ("aiter", f"importable: {_fmt(a.importable)}, version {_fmt(a.version)}{error}")
        )
    for variable in report.variables:
        value = "" if variable.value is None else f"{variable.value!r}: "
        rows.append((variable.name, f"{value}{variable.reading.meaning}"))
    if report.split:
        eagle, v2_order = report.split["eagle"], report.split["v2_order"]
        rows.append(("stock split affected", f"{_fmt(eagle.affected)} ({eagle.detail})"))
        rows.append(
            ("stock drops context (V2 order)", f"{_fmt(v2_order.affected)} ({v2_order.detail})")
        )
    if report.plugins is not None:
        p = report.plugins
        points = f"{_fmt(p.general_entry_point)} / {_fmt(p.platform_entry_point)}"
        rows.append(("entry points (general/platform)", points))
        rows.append(("other platform plugins", _fmt(p.other_platform_plugins)))
    if report.policy is not None:
        rows.append(("policy", report.policy.message))
    if report.resolution is not None:
        r = report.resolution
        plugin = "the plugin" if resolves_to_plugin(r) else "not the plugin"
        rows.append(("ROCM_AITER_FA resolves to", f"{r.path} ({plugin})"))
        for name, case in r.behaviour.items():
            verdict = "ok" if case["ok"] else "WRONG"
            rows.append((f"  its builder, {name}", f"{verdict}: {case['detail']}"))
    if report.forward is not None:
        rows += _forward_rows(report.forward)
    return rows


def _forward_rows(check: ForwardCheck) -> list[tuple[str, Any]]:
    forward = check.report
    first, facts = forward.cases[0], forward.facts
    assert facts is not None  # the cases ran, so the release was probed
    compared = (
        "vLLM has no V1 runner to compare with"
        if facts.no_v1_runner
        else f"vLLM, in its own V1 order: {_fmt(first.v1_stock_chunks)}"
    )
    merge = (
        "vLLM's merge gives NaN on this vLLM; the plugin's output stays finite"
        if facts.merge_nan
        else "vLLM's merge keeps them finite on this vLLM"
    )
    return [
        (f"forward, {first.case}", f"on {forward.device}: ROCM_AITER_FA {check.detail}"),
        ("  served in", configuration_line(first.configuration)),
        ("  stock's backend", f"{len(check.stock_wrong)} requests wrong"),
        (
            "  served without their context",
            f"by stock: {check.stock_without_context} requests of these steps; counted by "
            f"ROCM_AITER_FA here: {check.counted}",
        ),
        (
            "  passes over cached context",
            f"{first['registered'].chunks} ({compared}). Each pass reads a slice of every "
            "request's cached context: fewer passes, a faster step",
        ),
        ("  two empty context chunks", merge),
        ("  attention sinks", sinks_line(facts)),
    ]


def sinks_line(facts: ReleaseFacts) -> str:
    """What the plugin does with a layer's attention sinks on this vLLM, from vLLM's own extend
    path as the forward child ran it."""
    if not facts.takes_sinks:
        return "this vLLM's ROCM_AITER_FA takes none"
    if facts.counts_sink_once:
        return (
            "vLLM's extend path counts a sink once itself (fixed upstream in 0.34.0): the "
            "plugin leaves it as it is"
        )
    if facts.counts_sink_once is None:
        return (
            "could not be read off vLLM's extend path: the plugin passes the sink to the "
            "new-token call only, which counts it once either way"
        )
    return (
        "vLLM's extend path counts a sink once per call; the plugin passes it to the new-token "
        "call only, so it counts once"
    )


def configuration_line(configuration: dict[str, Any]) -> str:
    """A forward case's configuration, as ``vllm serve`` options name it."""
    cache = configuration.get("kv_cache_dtype", "auto")
    if configuration.get("fp8_format"):
        cache += (
            f" ({configuration['fp8_format'].removeprefix('float8_')}, k/v scales "
            f"{configuration['k_scale']:g}/{configuration['v_scale']:g})"
        )
    layout = (
        ", VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=1"
        if configuration.get("kv_cache_layout") == "SHUFFLE"
        else ""
    )
    return (
        f"--kv-cache-dtype {cache}, --block-size {configuration.get('block_size')}, "
        f"head size {configuration.get('head_size')}, {configuration.get('dtype')}{layout}"
    )


def render(report: DoctorReport, out: TextIO) -> None:
    rows = _rows(report)
    width = max(len(label) for label, _ in rows) if rows else 0
    for label, value in rows:
        print(f"{label:<{width}}  {_fmt(value)}", file=out)
    for name, error in report.check_errors.items():
        print(f"CHECK FAILED  {name}: {error}", file=out)
    for problem in report.problems:
        print(f"PROBLEM  {problem}", file=out)
    for note in report.notes:
        print(f"NOTE  {note}", file=out)
    print(f"\n{report.verdict}", file=out)
