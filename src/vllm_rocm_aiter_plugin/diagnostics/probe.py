"""Probes of the installed vLLM, shared by the demo and the doctor: behaviour, not version strings."""

from __future__ import annotations

import tempfile
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
                raised = f"raises {type(exc).__name__}: {exc}".rstrip(": ")
                results[name] = {"ok": False, "detail": raised}
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
