"""Optional end-to-end EAGLE run on MI300: greedy output is the same with and without speculation."""

from __future__ import annotations

import os

import pytest

from tests.helpers import hardware

pytestmark = [pytest.mark.rocm, pytest.mark.mi300, pytest.mark.e2e]

PROMPTS = ["The capital of France is", "def fibonacci(n):", "List three prime numbers:"]


def _generate(speculative: bool) -> list[str]:
    import gc

    import torch
    from vllm import LLM, SamplingParams

    kwargs = {}
    if speculative:
        kwargs["speculative_config"] = {
            "method": "eagle",
            "model": os.environ[hardware.E2E_DRAFT_ENV],
            "num_speculative_tokens": 3,
        }
    llm = LLM(
        model=os.environ[hardware.E2E_TARGET_ENV],
        attention_backend="ROCM_AITER_FA",
        max_model_len=2048,
        gpu_memory_utilization=0.4,
        enforce_eager=True,
        **kwargs,
    )
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=48))
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return [o.outputs[0].text for o in outputs]


def test_eagle_greedy_output_matches_plain_decoding():
    assert _generate(speculative=True) == _generate(speculative=False)
