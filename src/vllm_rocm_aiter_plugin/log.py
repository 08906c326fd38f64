"""The plugin's logger, under ``vllm.`` so that vLLM's handler, format and
``VLLM_LOGGING_LEVEL`` apply to its lines."""

from __future__ import annotations

import logging

LOGGER_NAME = "vllm.rocm_aiter_plugin"


def logger() -> logging.Logger:
    """vLLM's logger of that name (``init_logger``), or the standard library's where vLLM's
    logging cannot load (the entry points must never raise)."""
    try:
        from vllm.logger import init_logger

        return init_logger(LOGGER_NAME)
    except Exception:
        return logging.getLogger(LOGGER_NAME)
