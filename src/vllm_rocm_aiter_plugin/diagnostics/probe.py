"""Probes of the installed vLLM, shared by the demo, the doctor, compat and the tests: behaviour,
not version strings; one probe for each fact."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from typing import Any

import torch

from vllm_rocm_aiter_plugin.rebind import loads_global

SHUFFLE_WRITE_NAME = "reshape_and_cache_shuffle_triton"
"""vLLM's shuffle-layout cache write (a Triton kernel it defines only on ROCm)."""


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


@dataclass(frozen=True)
class ReleaseFacts:
    """What the installed vLLM does that the plugin and its checks depend on, each found by running
    vLLM's code where it runs (the merge's Triton kernel needs Triton's interpreter on CPU)."""

    merge_nan: bool  # vLLM's merge_attn_states turns two empty states into NaN (fixed in 0.26.0)
    takes_sinks: bool  # ROCM_AITER_FA supports attention sinks (``supports_sink``)
    counts_sink_once: bool | None  # vLLM's extend path passes a sink to one call (0.34.0)
    non_causal_batches: bool  # model-runner V2's build_attn_metadata takes ``causal`` (0.33.0)
    no_shuffle_layout: str | None  # why stock's shuffle layout cannot run right, or None
    no_v1_runner: str | None  # why there are no V1-order steps (0.34.0 removed V1), or None


def takes_sinks() -> bool:
    """Whether this release's ROCM_AITER_FA backend says it supports attention sinks."""
    from vllm.v1.attention.backends.rocm_aiter_fa import AiterFlashAttentionBackend

    supports_sink = getattr(AiterFlashAttentionBackend, "supports_sink", None)
    return bool(supports_sink and supports_sink())


NO_SHUFFLE_LAYOUT = "this vLLM's ROCM_AITER_FA has no shuffle KV-cache layout"


def shuffle_layout_unavailable() -> str | None:
    """Why stock's shuffle KV-cache layout cannot run right here, or None: this vLLM has none, or
    keeps K and V interleaved within each block (``get_kv_cache_shape``), which AITER's shuffle decode
    cannot read (``docs/upstream/README.md``)."""
    from vllm.v1.attention.backends import rocm_aiter_fa

    backend = rocm_aiter_fa.AiterFlashAttentionBackend
    if not loads_global(rocm_aiter_fa.AiterFlashAttentionImpl.do_kv_cache_update.__code__,
                        SHUFFLE_WRITE_NAME):  # fmt: skip
        return NO_SHUFFLE_LAYOUT
    if hasattr(backend, "get_kv_cache_shape"):
        return (
            "this vLLM's shuffle layout keeps K and V interleaved within each block, which "
            "AITER's shuffle decode cannot read (an upstream defect, stock's and the plugin's "
            "alike: docs/upstream/README.md)"
        )
    return None


def release_facts(device: torch.device) -> ReleaseFacts:
    """Each probe, run on the installed vLLM (on ``device``, the merge's)."""
    from vllm.v1.attention.backends import rocm_aiter_fa

    from vllm_rocm_aiter_plugin import impl
    from vllm_rocm_aiter_plugin.diagnostics.model_runner import (
        builds_non_causal_batches,
        why_no_v1_order,
    )

    merge = vars(rocm_aiter_fa)[impl.MERGE_GLOBAL_NAME]  # the one vLLM's extend path calls
    return ReleaseFacts(
        merge_nan=impl.merge_makes_nan_of_empty_states(merge, device, torch.float16, 64),
        takes_sinks=takes_sinks(),
        counts_sink_once=impl.vllm_counts_sink_once(
            rocm_aiter_fa.AiterFlashAttentionImpl.extend_forward
        ),
        non_causal_batches=builds_non_causal_batches(),
        no_shuffle_layout=shuffle_layout_unavailable(),
        no_v1_runner=why_no_v1_order(),
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
