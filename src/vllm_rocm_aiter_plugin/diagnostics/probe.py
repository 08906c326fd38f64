"""Probes of the installed vLLM, shared by the demo and the doctor: behaviour, not version strings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


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
    from vllm_rocm_aiter_plugin.diagnostics.regions import context_rows_in_prefill

    batch = samples.v2_order_batch()
    try:
        raw = stock_utils.split_decodes_prefills_and_extends(batch, decode_threshold=1)
    except Exception as exc:
        return SplitProbe(True, f"stock split raises {type(exc).__name__} on a V2-ordered step")
    counts = tuple(int(c) for c in raw)
    query, seq = samples.v2_order_lens()
    lost = context_rows_in_prefill(counts, query, seq)
    if lost:
        dropped = sum(seq[row] - query[row] for row in lost)
        return SplitProbe(
            True,
            f"stock split returns {counts}: request {', '.join(map(str, lost))} with context goes "
            f"to the prefill region and ignores {dropped} cached tokens",
        )
    return SplitProbe(
        False, f"stock split returns {counts}: no row with context in the prefill region"
    )


def build_with(builder_cls: type, vllm_config: Any, batch: Any) -> Any:
    """``builder_cls(...).build(0, batch)`` for a full-attention layer of ``vllm_config`` on CPU
    (host buffers unpinned: there is no accelerator to pin for)."""
    import torch

    from vllm_rocm_aiter_plugin.diagnostics import samples
    from vllm_rocm_aiter_plugin.diagnostics.cpu_host import unpinned_host_memory

    builder = builder_cls(samples.kv_cache_spec(vllm_config), [], vllm_config, torch.device("cpu"))
    with unpinned_host_memory():  # both builders' extend paths pin host memory
        return builder.build(common_prefix_len=0, common_attn_metadata=batch)


def check_builder_behaviour(builder_cls: type) -> dict[str, dict[str, Any]]:
    """Build the two batches the plugin exists for with ``builder_cls`` on the tiny config, and
    say for each whether it built with correct regions.

    - ``eagle_pure_decode``: EAGLE's pure-decode batch without ``seq_lens_cpu_upper_bound``
      (threshold 4); correct = every request a decode.
    - ``v2_order``: ``samples.V2_ORDER_EXAMPLE`` (threshold 1); correct = no row with context in
      the prefill region, every request in a region.
    """
    from vllm_rocm_aiter_plugin.diagnostics import samples
    from vllm_rocm_aiter_plugin.diagnostics.regions import context_rows_in_prefill

    query, seq = samples.v2_order_lens()
    cases = {
        "eagle_pure_decode": (3, samples.eagle_decode_batch(num_reqs=4, num_speculative_tokens=3)),
        "v2_order": (0, samples.v2_order_batch()),
    }
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="tiny-llama-") as model_dir:
        samples.write_tiny_llama(model_dir)
        for name, (spec_tokens, batch) in cases.items():
            config = samples.tiny_vllm_config(model_dir, num_speculative_tokens=spec_tokens)
            try:
                meta = build_with(builder_cls, config, batch)
            except Exception as exc:
                results[name] = {"ok": False, "detail": f"raises {type(exc).__name__}: {exc}"}
                continue
            counts = (meta.num_decodes, meta.num_extends, meta.num_prefills)
            covered = sum(counts) == batch.num_reqs
            if name == "eagle_pure_decode":
                ok = covered and meta.num_decodes == batch.num_reqs
            else:
                ok = covered and not context_rows_in_prefill(counts, query, seq)
            results[name] = {
                "ok": ok,
                "detail": f"decodes/extends/prefills = {counts}"
                + ("" if ok else " (a request is attended wrongly)"),
            }
    return results


RESULT_MARK = "@@RESULT@@"
"""A child reports one JSON object on a stdout line that starts with this mark."""


@dataclass
class ChildResult:
    returncode: int
    result: Any  # the last reported object, None if the child reported nothing
    output: str  # stdout and stderr


def load_scaled(seconds: float) -> float:
    """``seconds`` for an idle machine, stretched by how far the load average exceeds the cores
    (the doctor's children import vLLM: minutes of CPU on a loaded machine)."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform
        return seconds
    return seconds * max(1.0, load / (os.cpu_count() or 1))


def _load_words() -> str:
    try:
        return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    except OSError:
        return "load unknown"


def run_process(
    command: list[str], env: Mapping[str, str], cwd: str | None, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run a child to its end, its output captured, within ``timeout`` seconds stretched by the
    machine's load (:func:`load_scaled`); raises ``TimeoutError`` saying a rerun may pass."""
    scaled = load_scaled(timeout)
    try:
        return subprocess.run(
            command, cwd=cwd, env=dict(env), capture_output=True, text=True, timeout=scaled,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise TimeoutError(
            f"a fresh Python process did not finish within {scaled:.0f} s ({_load_words()}); "
            "on a busy machine a rerun may pass"
        ) from exc


def run_python(
    code: str,
    env_overrides: Mapping[str, str | None] | None = None,
    *,
    prelude: str = "",
    cwd: str | None = None,
    timeout: float = 300,
) -> ChildResult:
    """Run ``code`` in a new interpreter, as vLLM starts its processes; the code reports by
    calling ``report(obj)``. ``env_overrides`` sets (or, with None, removes) variables."""
    env = dict(os.environ)
    for key, value in (env_overrides or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    header = (
        f"import json\ndef report(obj):\n    print({RESULT_MARK!r} + json.dumps(obj), flush=True)\n"
    )
    proc = run_process(
        [sys.executable, "-c", header + prelude + code], env=env, cwd=cwd, timeout=timeout
    )
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_MARK):
            result = json.loads(line[len(RESULT_MARK) :])
    return ChildResult(proc.returncode, result, proc.stdout + proc.stderr)


_RESOLVE_SCRIPT = """
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm_rocm_aiter_plugin.diagnostics.probe import check_builder_behaviour
backend = AttentionBackendEnum.ROCM_AITER_FA
builder = backend.get_class().get_builder_cls()
report({
    "path": backend.get_path(),
    "stock": backend.value,
    "builder": builder.__module__ + "." + builder.__qualname__,
    "behaviour": check_builder_behaviour(builder),
})
"""


def resolve_in_fresh_process(
    env_overrides: Mapping[str, str | None] | None = None, timeout: float = 300
) -> dict[str, Any]:
    """What ``ROCM_AITER_FA`` resolves to after vLLM loads its plugins in a new interpreter, and
    how its builder behaves there (:func:`check_builder_behaviour`).

    Returns ``{"path", "stock", "builder", "behaviour"}``; raises ``RuntimeError`` with the
    child's output on failure.
    """
    child = run_python(_RESOLVE_SCRIPT, env_overrides, timeout=timeout)
    if child.result is None:
        raise RuntimeError(
            f"resolution probe exited {child.returncode}: {child.output.strip()[-2000:]}"
        )
    return child.result
