"""Which attention backends vLLM's ROCm platform offers, for which kind of model, read off the
installed vLLM's own candidate list (``_get_backend_priorities`` in ``vllm/platforms/rocm.py``)
without importing it: that module queries the GPU when imported, and the doctor runs anywhere.

The plugin's platform tries ``VLLM_ATTENTION_BACKEND``'s backend only where vLLM's ROCm platform
can run it (``env_backend.why_rocm_cannot_run``): a ``ROCM_*`` backend, which vLLM then checks
against the model, or one of these candidates. Anything else it refuses with a WARNING.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass

PRIORITIES_FUNCTION = "_get_backend_priorities"
KINDS = {"use_sparse": "sparse-MLA models", "use_mla": "MLA models"}
OTHER_KIND = "models without MLA"


@dataclass(frozen=True)
class RocmBackends:
    """vLLM's ROCm candidates per kind of model, in the order vLLM's source names them."""

    by_kind: dict[str, tuple[str, ...]]
    source: str  # where they were read

    def kinds_running(self, name: str) -> list[str]:
        return [kind for kind, names in self.by_kind.items() if name in names]

    def names(self) -> list[str]:
        return list(dict.fromkeys(n for names in self.by_kind.values() for n in names))

    def verdict(self, name: str) -> tuple[str | None, str | None]:
        """``(problem, note)`` for ``VLLM_ATTENTION_BACKEND=name`` on ROCm: a problem where the
        plugin's platform refuses it for every model, a note where vLLM runs it for some kinds
        of model only (or checks it against the model at start), neither where every kind runs
        it."""
        kinds = self.kinds_running(name)
        if len(kinds) == len(self.by_kind):
            return None, None
        if kinds:
            others = [kind for kind in self.by_kind if kind not in kinds]
            return None, (
                f"VLLM_ATTENTION_BACKEND={name}: vLLM's ROCm platform offers it for "
                f"{' and '.join(kinds)} only; for {' and '.join(others)} vLLM rejects it and the "
                "plugin's platform selects automatically, with a WARNING"
            )
        if name.startswith("ROCM_"):
            return None, (
                f"VLLM_ATTENTION_BACKEND={name}: not among vLLM's ROCm candidates; vLLM checks it "
                "against the model at start, and where it rejects it the plugin's platform "
                "selects automatically, with a WARNING"
            )
        runs = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in self.by_kind.items())
        return (
            f"VLLM_ATTENTION_BACKEND={name} cannot run on ROCm: the plugin's platform refuses it "
            f"with a WARNING and selects automatically. Unset it, or name a backend vLLM's ROCm "
            f"platform runs ({runs})",
            None,
        )


def read_rocm_backends() -> RocmBackends:
    """vLLM's ROCm candidates per kind of model; raises LookupError where this vLLM's source
    does not have them in the shape read here (the doctor then says it could not tell)."""
    spec = importlib.util.find_spec("vllm.platforms.rocm")
    if spec is None or not spec.origin:
        raise LookupError("vllm.platforms.rocm is not installed")
    with open(spec.origin, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=spec.origin)
    function = next(
        (
            node
            for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name == PRIORITIES_FUNCTION
        ),
        None,
    )
    if function is None:
        raise LookupError(f"{spec.origin} has no {PRIORITIES_FUNCTION}")
    by_kind: dict[str, list[str]] = {kind: [] for kind in (*KINDS.values(), OTHER_KIND)}
    for statement in function.body:
        kind = OTHER_KIND
        if isinstance(statement, ast.If) and isinstance(statement.test, ast.Name):
            kind = KINDS.get(statement.test.id, OTHER_KIND)
        for node in ast.walk(statement):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "AttentionBackendEnum"
                and node.attr not in by_kind[kind]
            ):
                by_kind[kind].append(node.attr)
    if not all(by_kind.values()):
        raise LookupError(f"{spec.origin}: {PRIORITIES_FUNCTION} names no backend for some kind")
    return RocmBackends(
        {kind: tuple(names) for kind, names in by_kind.items()},
        f"{spec.origin}::{PRIORITIES_FUNCTION}",
    )
