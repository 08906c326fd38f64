"""vLLM's log while the demo or the doctor runs: held back, then only what an operator needs."""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from vllm_rocm_aiter_plugin.log import LOGGER_NAME

EXPLAINED: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"^Model Runner V2 requires Triton"),
        "vLLM's config check for serving: this process has no GPU driver, so vLLM turns Triton "
        "off in it. No model runner starts here: the checks call model-runner V2's own batch "
        "sort, and a child process runs vLLM's Triton kernels under Triton's interpreter.",
    ),
    (
        re.compile(r"^Failed to import from vllm\._C"),
        "vLLM's compiled CUDA ops need a GPU driver. The checks replace the one they need, the "
        "KV-cache write, with a torch reference.",
    ),
)
"""vLLM warnings that any machine without a GPU driver logs, and what they mean for the checks."""

TITLE = "vLLM's log (warnings, and the plugin's own lines; vLLM's INFO lines are left out):"


class HeldBack(logging.Handler):
    """The records seen: (logger, level, first line of the message) and how often."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen: Counter[tuple[str, str, str]] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        first_line = record.getMessage().splitlines()[0] if record.getMessage() else ""
        self.seen[(record.name, record.levelname, first_line)] += 1


def import_vllm_quietly() -> None:
    """Import vLLM with its log at WARNING while it imports. Some releases (0.24) resolve the
    platform inside ``import vllm`` and log, at INFO, the plugins they find, before
    :func:`held_back` can collect anything. An operator's own ``VLLM_LOGGING_LEVEL`` wins; the
    environment is restored, so the processes the commands start see the operator's."""
    quiet = "VLLM_LOGGING_LEVEL" not in os.environ
    if quiet:
        os.environ["VLLM_LOGGING_LEVEL"] = "WARNING"
    try:
        import vllm  # noqa: F401  (configures vLLM's logging, at that level)
    finally:
        if quiet:
            del os.environ["VLLM_LOGGING_LEVEL"]


@contextmanager
def held_back() -> Iterator[HeldBack]:
    """Within the block, vLLM's log records are collected instead of printed."""
    import vllm  # noqa: F401  (configures vLLM's logging)

    logger = logging.getLogger("vllm")
    held = HeldBack()
    saved, saved_level = logger.handlers[:], logger.level
    logger.handlers = [held]
    if logger.getEffectiveLevel() > logging.INFO:  # vLLM >= 0.30 configures it only in an engine
        logger.setLevel(logging.INFO)
    try:
        yield held
    finally:
        logger.handlers = saved
        logger.setLevel(saved_level)


def why(message: str) -> str | None:
    """Why a warning appears on a machine without a GPU driver, if it is one of those."""
    return next((text for pattern, text in EXPLAINED if pattern.search(message)), None)


def summary(held: HeldBack) -> list[str]:
    """The plugin's records, and vLLM's warnings (each known one with its explanation)."""
    lines = []
    for (name, level, message), count in held.seen.items():
        ours = name == LOGGER_NAME or name.startswith(f"{LOGGER_NAME}.")
        if not ours and logging.getLevelName(level) < logging.WARNING:
            continue
        lines.append(f"  {level} {message}{f' (x{count})' if count > 1 else ''}")
        explanation = why(message)
        if explanation:
            lines.append(f"    why here: {explanation}")
    return lines


def print_summary(held: HeldBack, err: TextIO) -> None:
    lines = summary(held)
    if lines:
        print(TITLE, file=err)
        for line in lines:
            print(line, file=err)
        print(file=err)
        err.flush()
