"""MI300 tier: the plugin's platform on a real ROCm machine, through vLLM's own selection path."""

from __future__ import annotations

import pytest

from tests.helpers.subprocess_util import run_child

pytestmark = [pytest.mark.rocm, pytest.mark.mi300]


@pytest.mark.parametrize(
    "value, expected",
    [("ROCM_AITER_FA", "ROCM_AITER_FA"), ("auto", None), ("ROCM_FLASH", "ROCM_ATTN"),
     ("XFORMERS", None), ("bogus", None)],
)  # fmt: skip
def test_vllm_attention_backend_through_vllms_selector(value, expected):
    child = run_child(
        """
        import torch
        from vllm.config import set_current_vllm_config
        from vllm.platforms import current_platform
        from vllm.platforms.rocm import RocmPlatform
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
        from vllm.v1.attention.selector import AttentionSelectorConfig, get_attn_backend
        from vllm_rocm_aiter_plugin.diagnostics import samples
        config = samples.tiny_vllm_config(device="cuda")
        with set_current_vllm_config(config):
            chosen = get_attn_backend(128, torch.bfloat16, "auto")
            layer = AttentionSelectorConfig(head_size=128, dtype=torch.bfloat16,
                                            kv_cache_dtype="auto", block_size=None)
            automatic = RocmPlatform.get_attn_backend_cls(None, layer)
        path = f"{chosen.__module__}.{chosen.__qualname__}"
        report({
            "platform": type(current_platform).__module__ + "." + type(current_platform).__name__,
            "field": config.attention_config.backend,
            "path": path,
            "automatic": automatic,
            "expected": {m.name: m.get_path() for m in AttentionBackendEnum
                         if m.name in ("ROCM_AITER_FA", "ROCM_ATTN")},
        })
        """,
        env={"VLLM_ATTENTION_BACKEND": value},
    )
    result = child.result
    assert result["platform"] == "vllm_rocm_aiter_plugin.platform.AiterRocmPlatform"
    assert result["field"] is None  # the variable writes no config field
    wanted = result["automatic"] if expected is None else result["expected"][expected]
    assert result["path"] == wanted
