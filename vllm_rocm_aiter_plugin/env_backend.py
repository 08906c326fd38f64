"""``VLLM_ATTENTION_BACKEND`` for vLLM releases that no longer read it (0.18 onwards).

ROCm launch scripts and CI configs still set ``VLLM_ATTENTION_BACKEND=ROCM_AITER_FA``; vLLM
0.18-0.33 silently ignore it. When the plugin's platform is active this maps the variable onto
``VllmConfig.attention_config.backend``, exactly as ``--attention-backend`` would. A plain function
over a ``VllmConfig`` so that it is tested on CPU; the platform class only calls it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from vllm.logger import init_logger

from vllm_rocm_aiter_plugin.policy import LOGGER_NAME

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

ENV_VAR = "VLLM_ATTENTION_BACKEND"
_AUTO = {"", "auto"}

logger = init_logger(LOGGER_NAME)


def parse_backend_name(value: str) -> AttentionBackendEnum | None:
    """The ``AttentionBackendEnum`` member named ``value`` (case-insensitive); None for ``auto``.

    Raises ``ValueError`` listing the valid names for anything else.
    """
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    name = value.strip().upper()
    if name.lower() in _AUTO:
        return None
    try:
        return AttentionBackendEnum[name]
    except (KeyError, ValueError):  # vLLM's enum raises ValueError for unknown names
        valid = ", ".join(member.name for member in AttentionBackendEnum)
        raise ValueError(
            f"{ENV_VAR}={value!r} is not an attention backend this vLLM knows. "
            f"Valid names: {valid} (or auto)."
        ) from None


def apply_env_attention_backend(
    vllm_config: VllmConfig, environ: Mapping[str, str] | None = None
) -> AttentionBackendEnum | None:
    """Select ``VLLM_ATTENTION_BACKEND`` on ``vllm_config`` unless ``--attention-backend`` was given.

    Returns the backend selected on the config afterwards (None = automatic selection). When both
    are set and disagree, the command-line value wins and a WARNING says so.
    """
    environ = os.environ if environ is None else environ
    value = environ.get(ENV_VAR)
    attention_config = vllm_config.attention_config
    if value is None:
        return attention_config.backend
    requested = parse_backend_name(value)
    configured = attention_config.backend
    if requested is None or configured == requested:
        return configured
    if configured is not None:
        logger.warning(
            "%s=%s is ignored: --attention-backend %s was also given and wins. Unset one of them.",
            ENV_VAR,
            value,
            configured.name,
        )
        return configured
    attention_config.backend = requested
    logger.info("Attention backend %s selected by %s.", requested.name, ENV_VAR)
    return requested
