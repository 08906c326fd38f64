"""Probes of the installed vLLM, shared by the demo and the doctor: behaviour, not version strings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class SplitProbe:
    """Whether vLLM's stock split fails on an EAGLE pure-decode batch without the upper bound."""

    affected: bool
    detail: str


def probe_stock_split() -> SplitProbe:
    """Run the installed vLLM's own split on the batch model-runner V2 builds for EAGLE."""
    from vllm.v1.attention.backends import utils as stock_utils

    from vllm_rocm_aiter_plugin.diagnostics import samples

    batch = samples.eagle_decode_batch(num_reqs=4, num_speculative_tokens=3)
    try:
        counts = stock_utils.split_decodes_prefills_and_extends(batch, decode_threshold=4)
    except Exception as exc:
        return SplitProbe(
            True, f"stock split raises {type(exc).__name__} on an EAGLE pure-decode batch"
        )
    return SplitProbe(False, f"stock split returns {tuple(int(c) for c in counts)}")


def probe_stock_v2_order() -> SplitProbe:
    """Run the installed vLLM's own split on a step in model-runner V2 order
    (``samples.V2_ORDER_EXAMPLE``): affected if a row with context lands in the prefill region,
    whose kernel attends only to the new tokens."""
    from vllm.v1.attention.backends import utils as stock_utils

    from vllm_rocm_aiter_plugin.diagnostics import samples

    batch = samples.v2_order_batch()
    try:
        counts = stock_utils.split_decodes_prefills_and_extends(batch, decode_threshold=1)
    except Exception as exc:
        return SplitProbe(True, f"stock split raises {type(exc).__name__} on a V2-ordered step")
    counts = tuple(int(c) for c in counts)
    first_prefill = counts[0] + counts[1]
    lost = [
        row
        for row, (_, context) in enumerate(samples.V2_ORDER_EXAMPLE)
        if context and row >= first_prefill
    ]
    if lost:
        dropped = sum(samples.V2_ORDER_EXAMPLE[row][1] for row in lost)
        return SplitProbe(
            True,
            f"stock split returns {counts}: request {', '.join(map(str, lost))} with context goes "
            f"to the prefill region and ignores {dropped} cached tokens",
        )
    return SplitProbe(
        False, f"stock split returns {counts}: no row with context in the prefill region"
    )


_RESOLVE_SCRIPT = """
import json
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.v1.attention.backends.registry import AttentionBackendEnum
backend = AttentionBackendEnum.ROCM_AITER_FA
print("@@RESULT@@" + json.dumps({"path": backend.get_path(), "stock": backend.value}))
"""


def resolve_in_fresh_process(
    env_overrides: Mapping[str, str | None] | None = None, timeout: float = 300
) -> dict[str, str]:
    """What ``ROCM_AITER_FA`` resolves to after vLLM loads its plugins in a new interpreter.

    ``env_overrides`` sets (or, with None, removes) environment variables for the child. Returns
    ``{"path": ..., "stock": ...}``; raises ``RuntimeError`` with the child's stderr on failure.
    """
    env = dict(os.environ)
    for key, value in (env_overrides or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    proc = subprocess.run(
        [sys.executable, "-c", _RESOLVE_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("@@RESULT@@"):
            return json.loads(line[len("@@RESULT@@") :])
    raise RuntimeError(f"resolution probe exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
