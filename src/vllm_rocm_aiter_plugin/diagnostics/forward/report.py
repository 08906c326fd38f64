"""What the forward check is asked and what it answers: one typed request, one typed report."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from vllm_rocm_aiter_plugin.diagnostics.forward.cases import ForwardCase
from vllm_rocm_aiter_plugin.diagnostics.probe import ReleaseFacts

DEFAULT_KERNEL_BUDGET = 64
"""vLLM's Triton gather, merge and shuffle-write kernels (slow in the interpreter: each token is a
program) take calls up to this many tokens; larger ones run the reference, checked against the
kernel on this many tokens (the merge's kernel also takes every token with two empty states)."""


@dataclass
class ForwardRequest:
    """The cases to run, with which backends (``stock``, ``plugin``, ``registered``: whatever
    ``ROCM_AITER_FA`` resolves to once vLLM has loaded its plugins), where; ``resolution`` adds
    what ``ROCM_AITER_FA`` resolves to and how its builder builds (the doctor's)."""

    cases: list[ForwardCase]
    kinds: list[str] = field(default_factory=lambda: ["stock", "plugin"])
    device: str = "cpu"
    kernel_budget: int | None = DEFAULT_KERNEL_BUDGET
    resolution: bool = False

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "cases": [c.to_json() for c in self.cases]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ForwardRequest:
        return cls(**{**data, "cases": [ForwardCase.from_json(c) for c in data["cases"]]})


@dataclass
class Row:
    """One request's output against its dense reference (``error`` None where not finite)."""

    req_id: str
    context: int
    query: int
    region: str
    error: float | None
    nan: bool

    def wrong(self, tolerance: float) -> bool:
        return self.nan or self.error is None or self.error > tolerance


@dataclass
class Outcome:
    """One backend on one case: its regions and context chunks, whether the plugin's builder ran
    its own build (None: another builder), and each request's row; or what raised."""

    kind: str
    regions: list[int] = field(default_factory=list)
    chunks: int = 0
    largest_chunk_tokens: int = 0
    own_build: bool | None = None
    counted: dict[str, int] | None = None  # what its builder counted (exposure); None: stock's
    unified_attention_calls: int | None = None
    rows: list[Row] = field(default_factory=list)
    error: str | None = None
    traceback: str | None = None

    def wrong(self, tolerance: float) -> set[str]:
        """Requests whose output is not finite or is off the reference."""
        return {r.req_id for r in self.rows if r.wrong(tolerance)}

    def nan(self) -> set[str]:
        return {r.req_id for r in self.rows if r.nan}

    def served_without_context(self) -> list[Row]:
        """Its rows with context in the prefill region, whose kernel attends to the new tokens
        only: what the exposure count counts where these are stock's regions."""
        return [r for r in self.rows if r.region == "prefill" and r.context]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        return cls(**{**data, "rows": [Row(**r) for r in data.get("rows", [])]})


@dataclass
class CaseResult:
    """A case as it ran (``outcomes`` by backend), or why it could not run here."""

    case: str
    order: str
    configuration: dict[str, Any]
    not_applicable: str | None = None
    threshold: int = 1
    order_ids: list[str] = field(default_factory=list)
    tolerance: float = 0.0
    note: str = ""
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    v1_stock_chunks: int | str | None = None  # stock's chunks for the requests in V1 order
    seconds: float = 0.0

    def __getitem__(self, kind: str) -> Outcome:
        return self.outcomes[kind]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CaseResult:
        outcomes = {k: Outcome.from_json(v) for k, v in data.get("outcomes", {}).items()}
        return cls(**{**data, "outcomes": outcomes})


@dataclass
class Resolution:
    """What ``ROCM_AITER_FA`` resolved to in the child, and how its builder built the batches the
    plugin exists for (``behaviour``: batch name -> ``{"ok", "detail"}``)."""

    path: str
    stock: str
    builder: str
    behaviour: dict[str, dict[str, Any]]

    @property
    def builds_correctly(self) -> bool:
        return all(case["ok"] for case in self.behaviour.values())


@dataclass
class ForwardReport:
    """Everything one forward run found. ``unavailable``: why vLLM's forward cannot run in that
    process (nothing else then); ``extras``: what the tests' own child adds."""

    vllm: str
    unavailable: str | None = None
    torch: str = ""
    plugin_file: str = ""
    device: str = ""
    gather: str = ""
    facts: ReleaseFacts | None = None
    cases: list[CaseResult] = field(default_factory=list)
    resolution: Resolution | None = None
    resolution_error: str | None = None
    references: list[str] = field(default_factory=list)
    unified_attention: dict[str, Any] = field(default_factory=dict)
    gather_calls: dict[str, int] = field(default_factory=dict)
    merge_calls: dict[str, int] = field(default_factory=dict)
    shuffle_write_calls: dict[str, int] = field(default_factory=dict)
    shuffle_write_ignores_kv_scales: bool | str | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    def case(self, name: str) -> CaseResult | None:
        return next((c for c in self.cases if c.case == name), None)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ForwardReport:
        resolution, facts = data.get("resolution"), data.get("facts")
        return cls(**{
            **data,
            "cases": [CaseResult.from_json(c) for c in data.get("cases", [])],
            "resolution": Resolution(**resolution) if resolution else None,
            "facts": ReleaseFacts(**facts) if facts else None,
        })  # fmt: skip

    def kernels_line(self) -> str:
        """Which kernels the forward ran, for a reader: torch references last."""
        if not self.references:
            return "AITER's and vLLM's own kernels"
        parts = ["vLLM's own Triton kernels"]
        if self.unified_attention.get("aiter"):
            calls = self.unified_attention.get("calls")
            parts.append(f"AITER's own Triton unified_attention ({_calls(calls)})")
        return "; ".join([*parts, "torch references for " + ", ".join(self.references)])

    def unified_attention_line(self) -> str:
        """What ran as AITER's ``unified_attention`` and how often."""
        used = self.unified_attention
        if not used:
            return "not reported by this forward"
        calls = used.get("calls")
        counted = (
            "" if calls is None else f"; {_calls(calls)}" if calls else "; not called by this step"
        )
        return f"{used['kernel']}{counted}"


def _calls(count: int | None) -> str:
    return f"{count} call" if count == 1 else f"{count} calls"
