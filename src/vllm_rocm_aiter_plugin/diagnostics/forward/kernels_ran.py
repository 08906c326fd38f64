"""How a forward report (:func:`.runner.run`) names the kernels that ran, for the demo's and the
doctor's reader. Import-light: no torch, no vLLM."""

from __future__ import annotations

from typing import Any


def kernels_line(report: dict[str, Any]) -> str:
    """Which kernels a report's forward ran, for a reader: torch references last."""
    references = report.get("references") or []
    used = report.get("unified_attention") or {}
    if not references:
        return "AITER's and vLLM's own kernels"
    parts = ["vLLM's own Triton kernels"]
    if used.get("aiter"):
        parts.append(f"AITER's own Triton unified_attention ({_calls(used.get('calls'))})")
    return "; ".join([*parts, "torch references for " + ", ".join(references)])


def unified_attention_line(report: dict[str, Any]) -> str:
    """What ran as AITER's ``unified_attention`` and how often."""
    used = report.get("unified_attention") or {}
    if not used:
        return "not reported by this forward"
    calls = used.get("calls")
    counted = (
        "" if calls is None else f"; {_calls(calls)}" if calls else "; not called by this step"
    )
    return f"{used['kernel']}{counted}"


def _calls(count: int | None) -> str:
    return f"{count} call" if count == 1 else f"{count} calls"
