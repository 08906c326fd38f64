"""The engine tier's models and runs (fixed prompts that hit each bug, with the engine options
they are served with), and the child that serves them through vLLM's ``LLM``."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_rocm_aiter_plugin.diagnostics import ab

VOCAB = 512
BLOCK_SIZE = 32  # CPU_ATTN takes multiples of 32; ROCM_AITER_FA takes 16 and 32
TOKEN_BUDGET = 256  # chunked prefill: a long prompt spans several steps
MAX_TOKENS = 8

ENGINE_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine core in this process
    "VLLM_USE_V2_MODEL_RUNNER": "1",  # model-runner V2, the deployment the plugin exists for
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "TRITON_INTERPRET": "1",  # vLLM's and AITER's Triton kernels under the interpreter
    "CUDA_VISIBLE_DEVICES": "",
}


def _prompts(seed: int, lengths: list[int]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(n)] for n in lengths]


def _v2_order_batches() -> list[list[list[int]]]:
    """Long prompts chunked over several steps beside short new ones (model-runner V2 sorts the
    short ones first), then prefix-cache hits beside a short new prompt."""
    first = _prompts(1, [600, 20, 35, 700])
    long_prompt = first[0]
    rng = random.Random(2)
    hits = [
        long_prompt[:512] + [rng.randrange(VOCAB) for _ in range(48)],
        long_prompt[:256] + [rng.randrange(VOCAB) for _ in range(100)],
        _prompts(3, [12])[0],
    ]
    return [first, hits]


def _prefix_hit_batches() -> list[list[list[int]]]:
    """A prompt alone, then prefix-cache hits on it beside a short new prompt, every prompt
    within one step's budget: each request's tokens are cut into steps the same way whether the
    scheduler runs it beside others or alone (with an fp8 cache the cut decides which K/V a
    request's attention reads before it is quantised)."""
    (first,) = _prompts(4, [200])
    rng = random.Random(5)
    return [
        [first],
        [
            first[:192] + [rng.randrange(VOCAB) for _ in range(40)],
            _prompts(6, [12])[0],
            first[:96] + [rng.randrange(VOCAB) for _ in range(30)],
        ],
    ]


def _prefix_reach_batches() -> list[list[list[int]]]:
    """A 600-token prompt beside two short new ones: its last chunk (tokens 512 to 599, after
    two steps of 256) shares a step with them, so stock's split serves it without its context
    and the K/V its wrong output gives the next layer is cached. Then, alone in every step it
    is in, a prompt whose first 576 tokens are that prompt's (18 full blocks of 32, the last two
    written from that chunk): a prefix-cache hit on them."""
    long_prompt, *short = _prompts(7, [600, 20, 35])
    (tail,) = _prompts(8, [24])
    return [[long_prompt, *short], [long_prompt[:576] + tail]]


@dataclass(frozen=True)
class EngineRun:
    """Prompts served batch after batch through vLLM's engine, with a model and options, and the
    oracle that judges each request's tokens (``engine_comparison.ORACLES``)."""

    name: str
    model: str  # a folder under the models directory (:func:`save_models`)
    options: dict[str, Any] = field(default_factory=dict)
    batches: list[list[list[int]]] = field(default_factory=_v2_order_batches)
    draft: str | None = None  # an EAGLE draft folder
    covers: str = ""
    oracle: str = "CPU_ATTN"  # or ONE_PER_STEP (engine_comparison.ORACLES says why)


ENGINE_RUNS = [
    EngineRun(
        "v2-order",
        "llama",
        covers="chunked prefill and prefix-cache hits beside short new prompts, in V2's order",
    ),
    EngineRun(
        "eagle",
        "llama",
        draft="eagle",
        covers="EAGLE with 2 draft tokens: the drafter's pure-decode metadata, verify rows",
    ),
    EngineRun(
        "fp8-kv",
        "llama",
        options={"kv_cache_dtype": "fp8"},
        batches=_prefix_hit_batches(),
        covers="an fp8 KV cache: prefix-cache hits beside a short new prompt",
        oracle="ONE_PER_STEP",
    ),
    EngineRun("sliding-window", "mistral-sw", covers="sliding window (128 tokens)"),
    EngineRun(
        "prefix-reach",
        "llama",
        batches=_prefix_reach_batches(),
        covers="a prefix-cache hit on blocks an exposed chunk wrote, served alone",
    ),
]
ENGINE_RUNS_BY_NAME = {run.name: run for run in ENGINE_RUNS}


def save_models(folder: Path) -> None:
    """Tiny random models, saved locally (no hub): a Llama (2 layers, head size 64, GQA 2), the
    same with a 128-token sliding window (Mistral), and a one-layer EAGLE draft for the Llama.
    Weights drawn wide enough (std 0.1) that greedy choices are not near-ties."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    shape = dict(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
        initializer_range=0.1, torch_dtype="float16",
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, **shape)).save_pretrained(folder / "llama")
    torch.manual_seed(0)
    mistral = MistralConfig(num_hidden_layers=2, sliding_window=128, **shape)
    MistralForCausalLM(mistral).save_pretrained(folder / "mistral-sw")
    draft = LlamaConfig(num_hidden_layers=1, architectures=["LlamaForCausalLM"], **shape)
    draft.save_pretrained(folder / "eagle")
    generator = torch.Generator().manual_seed(1)
    hidden, inter = shape["hidden_size"], shape["intermediate_size"]
    q_out, kv_out = 4 * 64, 2 * 64

    def weight(*size: int) -> torch.Tensor:
        return (torch.randn(*size, generator=generator) * 0.1).to(torch.float16)

    save_file(
        {
            "fc.weight": weight(hidden, 2 * hidden),
            "layers.0.self_attn.q_proj.weight": weight(q_out, hidden),
            "layers.0.self_attn.k_proj.weight": weight(kv_out, hidden),
            "layers.0.self_attn.v_proj.weight": weight(kv_out, hidden),
            "layers.0.self_attn.o_proj.weight": weight(hidden, q_out),
            "layers.0.mlp.gate_proj.weight": weight(inter, hidden),
            "layers.0.mlp.up_proj.weight": weight(inter, hidden),
            "layers.0.mlp.down_proj.weight": weight(hidden, inter),
            "layers.0.post_attention_layernorm.weight": torch.ones(hidden, dtype=torch.float16),
        },
        str(folder / "eagle" / "model.safetensors"),
    )


def serve(
    run: EngineRun, models: Path, attention: str, one_per_step: bool = False
) -> dict[str, Any]:
    """One run through ``vllm-rocm-aiter-plugin ab``'s engine (``ab.generate``) with
    ``attention`` for every attention layer (the draft's too); ``one_per_step``: the scheduler
    runs one request at a time. Each request's tokens and logprobs, or the error, and what
    served ``ROCM_AITER_FA``."""
    options: dict[str, Any] = dict(
        model=str(models / run.model), skip_tokenizer_init=True, enforce_eager=True,
        dtype="float16", gpu_memory_utilization=0.1, max_model_len=1024, block_size=BLOCK_SIZE,
        max_num_batched_tokens=TOKEN_BUDGET, enable_chunked_prefill=True,
        enable_prefix_caching=True, seed=0, **run.options,
    )  # fmt: skip
    if one_per_step:
        options["max_num_seqs"] = 1
    if run.draft is not None:
        options["speculative_config"] = {
            "method": "eagle", "model": str(models / run.draft), "num_speculative_tokens": 2,
        }  # fmt: skip
    batches = [[{"prompt_token_ids": p} for p in batch] for batch in run.batches]
    result = ab.generate(options, batches, MAX_TOKENS, attention)
    result.update(run=run.name, one_per_step=one_per_step, aiter_fa=_aiter_fa_usage())
    return result


def _aiter_fa_usage() -> dict[str, Any]:
    """What the test platform's ``ROCM_AITER_FA`` ran in this process so far, if it is here."""
    try:
        from aiter_fa_on_cpu.backend import usage
    except ImportError:
        return {}
    return usage()


def serve_all(request: dict[str, Any]) -> dict[str, Any]:
    """In the engine tier's child (``child.call``, with ``ENGINE_ENV``): each named run through
    ``request["attention"]``, one request per step where asked."""
    missing = {k: v for k, v in ENGINE_ENV.items() if os.environ.get(k) != v}
    if missing:
        raise RuntimeError(f"start this child with {missing} (the engine tier's environment)")
    models, one_per_step = Path(request["models"]), request["one_request_per_step"]
    return {
        name: serve(ENGINE_RUNS_BY_NAME[name], models, request["attention"], one_per_step)
        for name in request["runs"]
    }
