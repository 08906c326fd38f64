"""The forward tier's child: the shipped runner's library with what only the tests add, run in a
fresh interpreter through the commands' own child protocol (``diagnostics.child``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vllm_rocm_aiter_plugin.diagnostics import child
from vllm_rocm_aiter_plugin.diagnostics.forward import runner
from vllm_rocm_aiter_plugin.diagnostics.forward.report import (
    CaseResult,
    ForwardReport,
    ForwardRequest,
)

ROOT = Path(__file__).resolve().parents[2]


TIER_KINDS = (*runner.KINDS, "observe")
"""Who serves each case in the tier: stock, the plugin, and observe mode (stock's output, counted)."""


@dataclass
class TierRequest:
    """A forward request and the tests' additions: which cases also run the ``CONTROLS``,
    whether to add the Scheduler's steps and the graph replays, and each mutation's cases."""

    forward: ForwardRequest
    controls: list[str] = field(default_factory=list)
    scheduler_steps: bool = False
    graph_replays: bool = False
    mutations: dict[str, list[str]] = field(default_factory=dict)
    stopgaps: list[str] = field(default_factory=list)  # cases also served by STOPGAP
    aiter_kernel: bool = True  # AITER's own Triton kernel where its wheel loads (CPU)

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "forward": self.forward.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TierRequest:
        return cls(**{**data, "forward": ForwardRequest.from_json(data["forward"])})


def controls() -> dict[str, type]:
    """``plugin-builder-only``: the plugin's builder with vLLM's own impl (what the plugin's impl
    is there for); ``plugin-vllm-build``: the plugin's backend whose builder runs vLLM's build()
    code with the plugin's split (``own_build=False``: stock's context chunk sizes)."""
    from vllm.v1.attention.backends.rocm_aiter_fa import AiterFlashAttentionImpl

    from vllm_rocm_aiter_plugin.backend import PluginAiterFlashAttentionBackend
    from vllm_rocm_aiter_plugin.builder import PluginAiterFlashAttentionMetadataBuilder

    builder = type(
        "PluginBuilderWithVllmBuild",
        (PluginAiterFlashAttentionMetadataBuilder,),
        {"__init__": functools.partialmethod(
            PluginAiterFlashAttentionMetadataBuilder.__init__, own_build=False)},
    )  # fmt: skip
    return {
        "plugin-builder-only": type(
            "PluginBuilderOnlyBackend",
            (PluginAiterFlashAttentionBackend,),
            {"get_impl_cls": staticmethod(lambda: AiterFlashAttentionImpl)},
        ),
        "plugin-vllm-build": type(
            "PluginVllmBuildBackend",
            (PluginAiterFlashAttentionBackend,),
            {"get_builder_cls": staticmethod(lambda: builder)},
        ),
    }


STOPGAP = "TRITON_ATTN"
"""What the README offers where the plugin cannot go in: a backend without the three-way split."""
STOPGAP_CASES = ("v2-sinks", "v2-head128-block32-gqa4", "v2-head256-block32-gqa8",
                 "eagle-mixed-v2-head128-block32-mha")  # fmt: skip
"""V2-ordered steps on which stock's ``ROCM_AITER_FA`` serves a row without its context, small
enough for vLLM's Triton kernels under the interpreter (the 8192-token ones take minutes), with a
16-bit cache (vLLM's Triton cache write refuses fp8 below SM89, the interpreter included)."""


def stopgap() -> dict[str, type]:
    """``STOPGAP``'s backend class, as vLLM's registry gives it."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    return {STOPGAP: AttentionBackendEnum[STOPGAP].get_class()}


def extra_backends(tier: TierRequest, name: str) -> dict[str, type]:
    """What else serves case ``name`` in ``tier``: the controls, the stopgap."""
    return {
        **(controls() if name in tier.controls else {}),
        **(stopgap() if name in tier.stopgaps else {}),
    }


def unified_attention(
    device: torch.device, aiter_kernel: bool, budget: int | None = None, reuse: bool = False
) -> Any:
    """AITER's own Triton kernel on CPU where its wheel loads (on its first ``budget`` calls;
    ``reuse``: ``aiter_triton.AiterUnifiedAttention``'s); else the shipped default."""
    if device.type == "cpu" and aiter_kernel:
        from tests.helpers.aiter_triton import load_unified_attention

        kernel, why_not = load_unified_attention(budget, reuse)
        if kernel is not None:
            return kernel
        default = runner.unified_attention_for(device)
        if default is not None:
            default.origin = f"the torch reference ({why_not})"
        return default
    return runner.unified_attention_for(device)


def run(tier: TierRequest) -> ForwardReport:
    """``tier`` in this process."""
    import vllm

    from tests.helpers import forward_mutations, graph_replay, scheduler_trace

    request = tier.forward
    device = torch.device(request.device)
    unavailable = runner.why_unavailable(device)
    if unavailable:
        return ForwardReport(vllm=vllm.__version__, unavailable=unavailable)
    backends = {kind: runner.backend_for(kind) for kind in request.kinds}
    cases = [*request.cases, *(scheduler_trace.scheduler_cases() if tier.scheduler_steps else [])]
    kernel = unified_attention(device, tier.aiter_kernel, reuse=True)
    with runner.forward_environment(device, request.kernel_budget, kernel) as forward:
        report = forward.report()
        report.cases = [
            forward.run_case(case, {**backends, **extra_backends(tier, case.name)})
            for case in runner.cases_here(cases)
        ]
        if tier.graph_replays:
            replayed = {k: v for k, v in backends.items() if k in runner.KINDS}
            report.extras["graph_replays"] = graph_replay.run_all(forward, replayed)
        forward.count_calls(report)
    from vllm_rocm_aiter_plugin.diagnostics.forward.cases import CASES_BY_NAME

    for name, names in tier.mutations.items():
        on_aiter = tier.aiter_kernel and name not in forward_mutations.OF_THE_REFERENCE
        kernel = unified_attention(device, on_aiter, reuse=True)
        with (
            forward_mutations.planted(name, kernel),
            runner.forward_environment(device, request.kernel_budget, kernel) as forward,
        ):
            ran = [forward.run_case(CASES_BY_NAME[n], backends) for n in names]
        report.extras.setdefault("mutations", {})[name] = {
            "cases": [dataclasses.asdict(c) for c in ran],
            "unified_attention": kernel.to_json() if kernel is not None else {},
        }
    return report


def mutated(report: ForwardReport, name: str) -> tuple[list[CaseResult], dict[str, Any]]:
    """The cases mutation ``name`` ran, and what ran as AITER's ``unified_attention`` there."""
    found = report.extras["mutations"][name]
    return [CaseResult.from_json(c) for c in found["cases"]], found["unified_attention"]


def start(tier: TierRequest) -> child.Started:
    """:func:`run` started in a fresh interpreter, the repository's root on its path."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return child.call(
        f"{__name__}:run_json", tier.to_json(), timeout=3600,
        env={**runner.child_env(tier.forward.device), "PYTHONPATH": path},
    )  # fmt: skip


def run_in_child(tier: TierRequest) -> ForwardReport:
    return runner.finish(start(tier))


COUNTED = ("calls", "bf16_widened_calls", "fp8_cache_calls", "cross_checked_calls",
           "reference_only_calls", "repeated_calls", "cross_check_disagreements")  # fmt: skip


def merged(first: ForwardReport, second: ForwardReport) -> ForwardReport:
    """Two children's reports of one tier as one: the cases of both, the calls summed."""
    used = dict(first.unified_attention)
    for key in COUNTED:
        if isinstance(used.get(key), int):
            used[key] += second.unified_attention[key]
    largest = dict(used.get("cross_check_largest_error") or {})
    for dtype, error in (second.unified_attention.get("cross_check_largest_error") or {}).items():
        largest[dtype] = max(largest.get(dtype, 0.0), error)
    if "cross_check_largest_error" in used:
        used["cross_check_largest_error"] = largest
    return dataclasses.replace(
        first,
        cases=[*first.cases, *second.cases],
        unified_attention=used,
        gather_calls={k: v + second.gather_calls[k] for k, v in first.gather_calls.items()},
        merge_calls={k: v + second.merge_calls[k] for k, v in first.merge_calls.items()},
        shuffle_write_calls={
            k: v + second.shuffle_write_calls[k] for k, v in first.shuffle_write_calls.items()
        },
        extras={**first.extras, **second.extras},
    )


def run_json(tier: dict[str, Any]) -> dict[str, Any]:
    """:func:`run` on a JSON request, the report as JSON (the child's side of :func:`start`)."""
    return run(TierRequest.from_json(tier)).to_json()


CONTROL_CASES = ("multi-chunk-v2", "64-prompts-v2", "v2-sinks")
MUTATED_CASES = {
    "reference-drops-kv-scales": ["eagle-mixed-v2-fp8-e4m3fnuz"],
    "widened-fp8-caches": ["eagle-mixed-v2-fp8-e4m3fnuz"],
    "reference-drops-sink-on-causal-calls": ["v2-sinks"],
    "exposure-misses-a-row": ["v2-example"],
}


@functools.cache
def tier_report() -> ForwardReport:
    """The CPU forward tier's one run, read by every test of ``tests/forward/test_forward.py``:
    every case, the controls, the stopgap, the Scheduler's steps, the graph replays and the
    mutations, in two children side by side (each half the cases; the machines have two cores)."""
    from vllm_rocm_aiter_plugin.diagnostics.forward.cases import CASES

    kinds = list(TIER_KINDS)
    halves = (
        TierRequest(ForwardRequest(list(CASES[0::2]), kinds), list(CONTROL_CASES),
                    scheduler_steps=True, mutations=MUTATED_CASES, stopgaps=list(STOPGAP_CASES)),
        TierRequest(ForwardRequest(list(CASES[1::2]), kinds), list(CONTROL_CASES),
                    graph_replays=True, stopgaps=list(STOPGAP_CASES)),
    )  # fmt: skip
    started = [start(half) for half in halves]
    first, second = (runner.finish(s) for s in started)
    if first.unavailable or second.unavailable:
        return first if first.unavailable else second
    return merged(first, second)


def tier_report_or_skip() -> ForwardReport:
    """:func:`tier_report`; a skip, with its reason, where vLLM's forward cannot run here."""
    import pytest

    report = tier_report()
    if report.unavailable:
        pytest.skip(report.unavailable)
    return report
