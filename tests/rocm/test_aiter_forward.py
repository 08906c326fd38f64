"""MI300 tier: vLLM's AITER attention kernels driven by metadata from the plugin's builder.

For every batch shape, the registered ``ROCM_AITER_FA`` backend's impl runs ``forward`` on a paged
KV cache, and each request's output is compared with a reference written here: gather the
request's K/V from the cache through its block table, causal softmax attention in float32.
"""

from __future__ import annotations

import pytest
import torch

from vllm_rocm_aiter_plugin.diagnostics import samples

pytestmark = [pytest.mark.rocm, pytest.mark.mi300]

TOLERANCE = {torch.bfloat16: 2.5e-2, torch.float16: 5e-3}  # max |out - ref|, outputs are O(1)

BATCHES = {
    # name: (speculative tokens, query lens, context lens)
    "decode": (0, [1] * 8, [37, 120, 5, 900, 64, 16, 17, 2000]),
    "eagle-decode": (3, [4] * 6, [37, 120, 5, 900, 64, 16]),
    "extend-chunked": (0, [40, 17, 99, 8, 64, 3, 25, 11], [9000] * 8),  # 3 context chunks each
    "prefill": (0, [7, 300, 33, 128], [0, 0, 0, 0]),
    "mixed": (3, [4, 4, 2, 90, 33, 2, 150], [77, 300, 12, 5000, 0, 0, 0]),
    # Model-runner V2 order (sorted by query length): new prompts before rows with context, so
    # the extend region holds rows without context (they gather no context tokens).
    "v2-order": (0, [1, 1, 50, 800], [900, 37, 0, 8192]),
    "v2-order-eagle": (3, [4, 4, 2, 9, 70], [300, 77, 0, 0, 5000]),
    "v2-order-prefix-hit": (0, [1, 20, 30, 40, 60], [90, 0, 1024, 0, 0]),
}


def _reference(q, kv_cache, block_table, query_lens, seq_lens, scale, num_kv_heads):
    k_cache, v_cache = kv_cache.unbind(1)  # [blocks, block_size, kv_heads, head]
    block_size = k_cache.shape[1]
    outputs, start = [], 0
    for row, (ql, sl) in enumerate(zip(query_lens, seq_lens, strict=True)):
        positions = torch.arange(sl, device=q.device)
        blocks = block_table[row, positions // block_size].long()
        k = k_cache[blocks, positions % block_size].float()  # [sl, kv_heads, head]
        v = v_cache[blocks, positions % block_size].float()
        qr = q[start : start + ql].float()  # [ql, heads, head]
        group = qr.shape[1] // num_kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", qr, k) * scale
        q_pos = torch.arange(sl - ql, sl, device=q.device)[:, None]
        scores = scores.masked_fill(positions[None, :] > q_pos, float("-inf"))
        outputs.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), v))
        start += ql
    return outputs


# Model runners always set seq_lens_cpu_upper_bound on mixed batches; EAGLE leaves it None on
# pure-decode ones, so those run both ways.
CASES = [(name, True) for name in BATCHES] + [("decode", False), ("eagle-decode", False)]


@pytest.mark.parametrize(
    "batch_name, upper_bound",
    CASES,
    ids=[f"{n}-{'upper-bound' if u else 'no-upper-bound'}" for n, u in CASES],
)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_size", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_forward_matches_reference(
    tmp_path, device, dtype, head_size, block_size, batch_name, upper_bound
):
    from vllm.plugins import load_general_plugins
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    spec_tokens, query_lens, context_lens = BATCHES[batch_name]
    threshold = 1 + spec_tokens
    load_general_plugins()
    backend = AttentionBackendEnum.ROCM_AITER_FA.get_class()
    assert backend.__module__ == "vllm_rocm_aiter_plugin.backend", "plugin backend not registered"

    config = samples.tiny_vllm_config(
        samples.write_tiny_llama(tmp_path, head_size=head_size),
        num_speculative_tokens=spec_tokens,
        dtype=str(dtype).removeprefix("torch."),
        block_size=block_size,
    )
    layer_name = samples.attention_layer(config, backend=backend)
    layer = config.compilation_config.static_forward_context[layer_name].to(device)
    builder = backend.get_builder_cls()(samples.kv_cache_spec(config), [layer_name], config, device)
    assert builder.reorder_batch_threshold == threshold

    seq_lens = [q + c for q, c in zip(query_lens, context_lens, strict=True)]
    batch = samples.make_batch(
        query_lens, seq_lens, device=device, with_upper_bound=upper_bound, block_size=block_size
    )
    meta = builder.build(0, batch)

    num_blocks = int(batch.block_table_tensor.max()) + 1
    kv_cache = torch.zeros(
        backend.get_kv_cache_shape(num_blocks, block_size, samples.NUM_KV_HEADS, head_size),
        dtype=dtype, device=device,
    )  # fmt: skip
    generator = torch.Generator(device=device).manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, device=device, dtype=torch.float32).to(
            dtype
        )

    # Context tokens first, as earlier steps would have written them.
    context_slots = samples.make_batch(
        context_lens, context_lens, device=device, block_size=block_size
    ).slot_mapping
    total_context = int(sum(context_lens))
    if total_context:
        layer.impl.do_kv_cache_update(
            layer,
            randn(total_context, samples.NUM_KV_HEADS, head_size),
            randn(total_context, samples.NUM_KV_HEADS, head_size),
            kv_cache,
            context_slots[:total_context],
        )
    num_tokens = batch.num_actual_tokens
    q = randn(num_tokens, samples.NUM_HEADS, head_size)
    k = randn(num_tokens, samples.NUM_KV_HEADS, head_size)
    v = randn(num_tokens, samples.NUM_KV_HEADS, head_size)
    layer.impl.do_kv_cache_update(layer, k, v, kv_cache, batch.slot_mapping)
    output = torch.full_like(q, float("nan"))
    layer.impl.forward(layer, q, k, v, kv_cache, meta, output)
    torch.cuda.synchronize()

    expected = _reference(
        q,
        kv_cache,
        batch.block_table_tensor,
        query_lens,
        seq_lens,
        layer.impl.scale,
        samples.NUM_KV_HEADS,
    )
    start = 0
    for row, ref in enumerate(expected):
        got = output[start : start + query_lens[row]].float()
        error = (got - ref).abs().max().item()
        assert error <= TOLERANCE[dtype], f"{batch_name} request {row}: max error {error}"
        start += query_lens[row]
