"""The plugin's ROCm platform: vLLM's ``RocmPlatform`` plus ``VLLM_ATTENTION_BACKEND`` selection.

Imported only when ``platform_plugin`` found a ROCm GPU: ``vllm.platforms.rocm`` queries the GPU
at import time and cannot be imported elsewhere. What it does is in :mod:`.env_backend`; why:
``docs/deviations.md``, "platform: VLLM_ATTENTION_BACKEND".
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from vllm.platforms.rocm import RocmPlatform

from vllm_rocm_aiter_plugin.env_backend import (
    ENV_VAR,
    apply_env_attention_backend,
    resolve,
    select_attention_backend,
    why_rocm_cannot_run,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig


class AiterRocmPlatform(RocmPlatform):
    """vLLM's ROCm platform that also honours ``VLLM_ATTENTION_BACKEND``, never failing a start
    for it."""

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        apply_env_attention_backend(vllm_config)
        super().check_and_update_config(vllm_config)

    @classmethod
    def get_attn_backend_cls(cls, selected_backend: Any, *args: Any, **kwargs: Any) -> str:
        # Read from the environment, which vLLM's worker processes inherit with the config.
        env_selected = resolve(os.environ.get(ENV_VAR)).value
        select = super().get_attn_backend_cls

        def why_not_here(backend: Any) -> str | None:
            return why_rocm_cannot_run(cls, select, backend, *args, **kwargs)

        return select_attention_backend(
            select, selected_backend, env_selected, *args, why_not_here=why_not_here, **kwargs
        )
