"""MI300 tier: the plugin's platform on a real ROCm machine, through vLLM's own config path.

In a fresh interpreter, vLLM resolves ``current_platform`` from the platform plugins (the plugin's
``RocmPlatform`` subclass, since a ROCm GPU is present), and building a ``VllmConfig`` runs
``current_platform.check_and_update_config``: ``VLLM_ATTENTION_BACKEND`` then selects the backend.
"""

from __future__ import annotations

import pytest

from tests.subprocess_util import run_child

pytestmark = [pytest.mark.rocm, pytest.mark.mi300, pytest.mark.subprocess]


@pytest.mark.parametrize(
    "value, expected",
    [("ROCM_AITER_FA", "ROCM_AITER_FA"), ("auto", None), ("ROCM_FLASH", "ROCM_ATTN"),
     ("XFORMERS", None), ("bogus", None)],
)  # fmt: skip
def test_vllm_attention_backend_through_check_and_update_config(value, expected):
    child = run_child(
        """
        from vllm.platforms import current_platform
        from vllm_rocm_aiter_plugin.diagnostics import samples
        config = samples.tiny_vllm_config(device="cuda")
        backend = config.attention_config.backend
        report({
            "platform": type(current_platform).__module__ + "." + type(current_platform).__name__,
            "backend": None if backend is None else backend.name,
        })
        """,
        env={"VLLM_ATTENTION_BACKEND": value},
    )
    assert child.result["platform"] == "vllm_rocm_aiter_plugin.platform.AiterRocmPlatform"
    assert child.result["backend"] == expected
