"""Real vLLM objects for demos, probes, tests and benchmarks: a tiny offline VllmConfig and batches."""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.kv_cache_interface import AttentionSpec

NUM_HEADS = 8
NUM_KV_HEADS = 2
HEAD_SIZE = 128
BLOCK_SIZE = 16
MAX_MODEL_LEN = 65536

_TINY_LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": NUM_HEADS * HEAD_SIZE,
    "head_dim": HEAD_SIZE,
    "intermediate_size": 2048,
    "num_attention_heads": NUM_HEADS,
    "num_key_value_heads": NUM_KV_HEADS,
    "num_hidden_layers": 2,
    "vocab_size": 1024,
    "max_position_embeddings": MAX_MODEL_LEN,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}


def write_tiny_llama(
    directory: str | os.PathLike[str] | None = None,
    head_size: int = HEAD_SIZE,
    num_heads: int = NUM_HEADS,
    num_kv_heads: int = NUM_KV_HEADS,
    encoder_decoder: bool = False,
) -> str:
    """Write a tiny Llama ``config.json`` into ``directory``; if None, into a new temporary
    directory that is removed when the process exits. ``encoder_decoder`` marks it as an
    encoder-decoder model (``is_encoder_decoder``), which vLLM's backend selection reads."""
    if directory is None:
        directory = tempfile.mkdtemp(prefix="tiny-llama-")
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
    directory = str(directory)
    os.makedirs(directory, exist_ok=True)
    config = {
        **_TINY_LLAMA,
        "head_dim": head_size,
        "hidden_size": num_heads * head_size,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        **({"is_encoder_decoder": True} if encoder_decoder else {}),
    }
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    return directory


def write_tiny_eagle_draft(model_dir: str) -> str:
    """An EAGLE draft head's ``config.json`` for the tiny Llama in ``model_dir`` (a subdirectory)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    draft = os.path.join(model_dir, "eagle-draft")
    os.makedirs(draft, exist_ok=True)
    config.update(architectures=["EagleLlamaForCausalLM"], num_hidden_layers=1)
    with open(os.path.join(draft, "config.json"), "w") as f:
        json.dump(config, f)
    return draft


def tiny_vllm_config(
    model_dir: str | None = None,
    *,
    num_speculative_tokens: int = 0,
    max_num_seqs: int = 1024,
    max_num_batched_tokens: int = 65536,
    dtype: str = "bfloat16",
    block_size: int = BLOCK_SIZE,
    device: str = "cpu",
    cache_dtype: str = "auto",
    encoder_decoder: bool = False,
) -> VllmConfig:
    """A real ``VllmConfig`` over a tiny Llama, built offline."""
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        SpeculativeConfig,
        VllmConfig,
    )

    model_dir = model_dir or write_tiny_llama(encoder_decoder=encoder_decoder)
    model_config = ModelConfig(
        model=model_dir,
        tokenizer=model_dir,
        skip_tokenizer_init=True,
        dtype=cast(Any, dtype),  # a dtype name vLLM accepts
        max_model_len=MAX_MODEL_LEN,
    )
    parallel_config = ParallelConfig()
    speculative_config = None
    if num_speculative_tokens:
        speculative_config = SpeculativeConfig(
            method="eagle",
            model=write_tiny_eagle_draft(model_dir),
            num_speculative_tokens=num_speculative_tokens,
            target_model_config=model_config,
            target_parallel_config=parallel_config,
        )
    return VllmConfig(
        model_config=model_config,
        cache_config=CacheConfig(block_size=block_size, cache_dtype=cast(Any, cache_dtype)),
        parallel_config=parallel_config,
        scheduler_config=SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=MAX_MODEL_LEN,
            is_encoder_decoder=encoder_decoder,
        ),
        device_config=DeviceConfig(device=device),  # type: ignore[arg-type]
        speculative_config=speculative_config,
    )


def kv_cache_spec(vllm_config: VllmConfig, sliding_window: int | None = None) -> AttentionSpec:
    """The KV-cache spec vLLM would give a full-attention (or sliding-window) layer."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    model = vllm_config.model_config
    common: dict[str, Any] = dict(
        block_size=vllm_config.cache_config.block_size,
        num_kv_heads=model.get_num_kv_heads(vllm_config.parallel_config),
        head_size=model.get_head_size(),
        dtype=model.dtype,
    )
    if sliding_window is not None:
        return SlidingWindowSpec(sliding_window=sliding_window, **common)
    return FullAttentionSpec(**common)


def attention_layer(
    vllm_config: VllmConfig,
    *,
    sliding_window: int | None = None,
    backend: type | None = None,
    layer_index: int = 0,
    sinks: torch.Tensor | None = None,
) -> str:
    """Create (once) a real vLLM ``Attention`` layer on ``vllm_config`` and return its name."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention import Attention

    if backend is None:
        from vllm.v1.attention.backends.rocm_aiter_fa import AiterFlashAttentionBackend as backend

    name = f"model.layers.{layer_index}.self_attn.attn"
    extra_impl_args: dict[str, Any] = {} if sinks is None else {"sinks": sinks}
    if name not in vllm_config.compilation_config.static_forward_context:
        model = vllm_config.model_config
        head_size = model.get_head_size()
        with set_current_vllm_config(vllm_config):
            Attention(
                model.get_num_attention_heads(vllm_config.parallel_config),
                head_size,
                head_size**-0.5,
                num_kv_heads=model.get_num_kv_heads(vllm_config.parallel_config),
                cache_config=vllm_config.cache_config,
                per_layer_sliding_window=sliding_window,
                prefix=name,
                attn_backend=backend,
                **extra_impl_args,
            )
    return name


def has_seq_lens_upper_bound_field() -> bool:
    """Whether the installed vLLM's ``CommonAttentionMetadata`` has ``seq_lens_cpu_upper_bound``."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    return "seq_lens_cpu_upper_bound" in {
        f.name for f in dataclasses.fields(CommonAttentionMetadata)
    }


def make_batch(
    query_lens: Sequence[int],
    seq_lens: Sequence[int],
    *,
    device: str | torch.device = "cpu",
    with_upper_bound: bool = True,
    upper_bound_slack: Sequence[int] | None = None,
    num_padding_tokens: int = 0,
    max_query_len: int | None = None,
    block_size: int = BLOCK_SIZE,
    block_table: torch.Tensor | None = None,
    causal: bool = True,
) -> CommonAttentionMetadata:
    """A real ``CommonAttentionMetadata`` for requests with the given query and sequence lengths:
    each request's new tokens in the slots of its ``block_table`` row (by default, consecutive
    blocks), padding tokens with slot -1."""
    import torch
    from vllm.v1.attention.backend import CommonAttentionMetadata

    if len(query_lens) != len(seq_lens):
        raise ValueError("query_lens and seq_lens must have the same length")
    num_reqs = len(query_lens)
    query_start_loc = torch.zeros(num_reqs + 1, dtype=torch.int32)
    if num_reqs:
        torch.cumsum(torch.tensor(query_lens, dtype=torch.int32), 0, out=query_start_loc[1:])
    seq_lens_cpu = torch.tensor(seq_lens, dtype=torch.int32)
    num_tokens = int(query_start_loc[-1]) + num_padding_tokens
    if block_table is None:
        width = max([-(-s // block_size) for s in seq_lens] + [1])
        block_table = torch.arange(num_reqs * width, dtype=torch.int32).reshape(num_reqs, width)
    slot_mapping = torch.full((num_tokens,), -1, dtype=torch.int64)
    for row, (q, s) in enumerate(zip(query_lens, seq_lens, strict=True)):
        start = int(query_start_loc[row])
        slot_mapping[start : start + q] = slots_of(block_table[row], block_size, s - q, s)
    kwargs: dict[str, Any] = dict(
        query_start_loc=query_start_loc.to(device),
        query_start_loc_cpu=query_start_loc,
        seq_lens=seq_lens_cpu.to(device),
        num_reqs=num_reqs,
        num_actual_tokens=num_tokens,
        max_query_len=max(query_lens, default=0) if max_query_len is None else max_query_len,
        max_seq_len=max(seq_lens, default=0),
        block_table_tensor=block_table.to(device),
        slot_mapping=slot_mapping.to(device),
    )
    if has_seq_lens_upper_bound_field():
        upper_bound = None
        if with_upper_bound:
            upper_bound = seq_lens_cpu.clone()
            if upper_bound_slack is not None:
                upper_bound += torch.tensor(upper_bound_slack, dtype=torch.int32)
        kwargs["seq_lens_cpu_upper_bound"] = upper_bound
    if not causal:
        if "causal" not in {f.name for f in dataclasses.fields(CommonAttentionMetadata)}:
            raise NotImplementedError("this vLLM's CommonAttentionMetadata has no causal field")
        kwargs["causal"] = False
    return CommonAttentionMetadata(**kwargs)


def slots_of(row: torch.Tensor, block_size: int, start: int, end: int) -> torch.Tensor:
    """The KV-cache slots of positions ``start`` to ``end`` of the request whose block-table row
    is ``row``."""
    import torch

    positions = torch.arange(start, end)
    return row[positions // block_size].long() * block_size + positions % block_size


def eagle_decode_batch(
    num_reqs: int = 4, num_speculative_tokens: int = 3, context_len: int = 100, **kwargs: Any
) -> CommonAttentionMetadata:
    """The pure-decode batch model-runner V2 builds for EAGLE: each request verifies
    ``1 + num_speculative_tokens`` tokens, and ``seq_lens_cpu_upper_bound`` is None."""
    query_len = 1 + num_speculative_tokens
    return make_batch(
        [query_len] * num_reqs,
        [context_len + query_len + 7 * i for i in range(num_reqs)],
        with_upper_bound=False,
        **kwargs,
    )


V2_ORDER_EXAMPLE: tuple[tuple[int, int], ...] = ((1, 900), (50, 0), (800, 8192))
"""(query length, context length) per request of a step in model-runner V2 order at threshold 1:
a decode, a new prompt, then the next chunk of a long prompt with 8192 cached tokens. V2 sorts by
query length, so the row with context comes after the new prompt."""


def v2_order_lens() -> tuple[list[int], list[int]]:
    """Query and sequence lengths of :data:`V2_ORDER_EXAMPLE`."""
    return [q for q, _ in V2_ORDER_EXAMPLE], [q + c for q, c in V2_ORDER_EXAMPLE]


def v2_order_batch(**kwargs: Any) -> CommonAttentionMetadata:
    """:data:`V2_ORDER_EXAMPLE` as a real ``CommonAttentionMetadata`` (with the upper bound, as
    model-runner V2's main step passes it)."""
    return make_batch(*v2_order_lens(), **kwargs)
