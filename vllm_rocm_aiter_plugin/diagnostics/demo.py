"""The main job on any machine: show the bug, show the fix, on the installed vLLM (CPU is enough).

Steps: report versions; probe the stock split on an EAGLE pure-decode batch; let vLLM load its
plugins and check what ``ROCM_AITER_FA`` resolves to; build that batch with vLLM's stock builder and
with the registered backend's builder (a real ``VllmConfig`` over a tiny Llama, 3 speculative tokens);
then build a step in model-runner V2 order, where stock puts a row with context in the prefill
region. Exit 0 when the registered builder is the plugin's and builds both batches.
"""

from __future__ import annotations

import sys
from typing import TextIO


def _build(builder_cls: type, vllm_config: object, batch: object) -> tuple[bool, str]:
    import torch

    from vllm_rocm_aiter_plugin.diagnostics import samples
    from vllm_rocm_aiter_plugin.diagnostics.cpu_host import unpinned_host_memory

    builder = builder_cls(samples.kv_cache_spec(vllm_config), [], vllm_config, torch.device("cpu"))
    try:
        with unpinned_host_memory():  # both builders' extend paths pin host memory; no GPU here
            meta = builder.build(common_prefix_len=0, common_attn_metadata=batch)
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}".rstrip(": ")
    return True, (
        f"{type(meta).__name__}(num_decodes={meta.num_decodes}, num_extends={meta.num_extends}, "
        f"num_prefills={meta.num_prefills}, num_decode_tokens={meta.num_decode_tokens}, "
        f"num_extend_tokens={meta.num_extend_tokens})"
    )


def run(out: TextIO = sys.stdout) -> int:
    import torch
    import vllm
    from vllm.plugins import load_general_plugins
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.backends.rocm_aiter_fa import AiterFlashAttentionMetadataBuilder

    from vllm_rocm_aiter_plugin import __version__, policy
    from vllm_rocm_aiter_plugin.diagnostics import probe, samples

    def say(label: str, value: object) -> None:
        print(f"{label:<34} {value}", file=out)

    say("vllm-rocm-aiter-plugin", __version__)
    say(
        "vLLM",
        f"{vllm.__version__} (tested {policy.format_version(policy.MIN_SUPPORTED_VLLM)}"
        f"-{policy.format_version(policy.NEWEST_TESTED_VLLM)}: "
        f"{'yes' if policy.in_tested_range(vllm.__version__) else 'NO'})",
    )
    say("torch", torch.__version__)
    split_probe = probe.probe_stock_split()
    say("stock split affected", f"{'YES' if split_probe.affected else 'no'} ({split_probe.detail})")

    load_general_plugins()
    backend = AttentionBackendEnum.ROCM_AITER_FA
    resolved = backend.get_path()
    active = resolved == policy.BACKEND_QUALNAME
    say("ROCM_AITER_FA resolves to", f"{resolved} ({'plugin' if active else 'NOT the plugin'})")

    vllm_config = samples.tiny_vllm_config(num_speculative_tokens=3)
    batch = samples.eagle_decode_batch(num_reqs=4, num_speculative_tokens=3)
    print(
        "\nEAGLE pure-decode batch: 4 requests x 4 tokens, seq_lens_cpu_upper_bound=None", file=out
    )
    _, stock_result = _build(AiterFlashAttentionMetadataBuilder, vllm_config, batch)
    registered_builder = backend.get_class().get_builder_cls()
    plugin_ok, plugin_result = _build(registered_builder, vllm_config, batch)
    say("  vLLM's stock builder", stock_result)
    say("  registered builder", f"{registered_builder.__module__}.{registered_builder.__name__}")
    say("", plugin_result)

    v2_probe = probe.probe_stock_v2_order()
    v2_config = samples.tiny_vllm_config()
    v2_batch = samples.v2_order_batch()
    steps = ", ".join(f"q={q} ctx={c}" for q, c in samples.V2_ORDER_EXAMPLE)
    print(f"\nModel-runner V2 step (sorted by query length, threshold 1): {steps}", file=out)
    print(
        "  the six counts: (decodes, extends, prefills, decode tokens, extend tokens, prefill "
        "tokens); the prefill kernel attends only to a row's new tokens, so a row with context "
        "must not be a prefill",
        file=out,
    )
    say(
        "  stock split drops context", f"{'YES' if v2_probe.affected else 'no'} ({v2_probe.detail})"
    )
    _, stock_v2 = _build(AiterFlashAttentionMetadataBuilder, v2_config, v2_batch)
    v2_ok, plugin_v2 = _build(registered_builder, v2_config, v2_batch)
    say("  vLLM's stock builder", stock_v2)
    say("  registered builder", plugin_v2)

    fixed = active and plugin_ok and v2_ok
    if fixed:
        verdict = (
            "fix ACTIVE: ROCM_AITER_FA builds EAGLE pure-decode batches and keeps every row with "
            "context out of the prefill region"
        )
    elif not active:
        verdict = (
            "fix NOT active: ROCM_AITER_FA is not the plugin's (see the log above, or run doctor)"
        )
    else:
        verdict = "fix NOT working: the plugin builder failed on the sample batch"
    print(f"\n{verdict}", file=out)
    return 0 if fixed else 1
