"""The doctor's checks answered as on a healthy install, so that the one problem a test plants is
all that differs (``doctor.collect(overrides)``)."""

from __future__ import annotations

from typing import Any

from vllm_rocm_aiter_plugin import policy
from vllm_rocm_aiter_plugin.diagnostics import doctor
from vllm_rocm_aiter_plugin.diagnostics.forward.report import (
    CaseResult,
    ForwardReport,
    Outcome,
    Resolution,
    Row,
)
from vllm_rocm_aiter_plugin.diagnostics.probe import ReleaseFacts

STOCK = "vllm.v1.attention.backends.rocm_aiter_fa.AiterFlashAttentionBackend"


def resolution(path: str = policy.BACKEND_QUALNAME, builds: bool = True) -> Resolution:
    behaviour = {"v2_order": {"ok": builds, "detail": "decodes/extends/prefills = (1, 2, 0)"}}
    return Resolution(path, STOCK, "b", behaviour)


def forward(right: bool = True) -> doctor.ForwardCheck:
    """A forward check of one step, the registered backend ``right`` or off on every row."""
    row = Row("a", 10, 5, "extend", 0.0 if right else 1.0, False)
    outcomes = {kind: Outcome(kind, [0, 1, 0], 1, rows=[row]) for kind in ("stock", "registered")}
    case = CaseResult("c", "v2", {"block_size": 16, "head_size": 64}, tolerance=0.01,
                      order_ids=["a"], outcomes=outcomes)  # fmt: skip
    facts = ReleaseFacts(False, False, None, False, None, None)
    report = ForwardReport(vllm="0", device="cpu", cases=[case], facts=facts)
    return doctor.check_forward(report)


def passing_fresh_process_checks() -> dict[str, Any]:
    """The two checks of the fresh process, answered as on a healthy install."""
    return {"resolution": lambda: resolution(), "forward": lambda: forward()}


def healthy_in_process_checks() -> dict[str, Any]:
    """The checks that would otherwise report this machine's own findings, answered as on a
    healthy install, plus :func:`passing_fresh_process_checks`."""
    plugins = doctor.Plugins("site-packages", True, True, [])
    active = policy.Decision(True, "INFO", "ROCM_AITER_FA -> the plugin")
    return {**passing_fresh_process_checks(), "plugins": lambda: plugins, "policy": lambda: active}
