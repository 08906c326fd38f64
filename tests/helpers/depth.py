"""How deep the randomised tests go. The default run draws a tenth of each test's examples (at
least 20), so that it stays a contributor's loop; ``VLLM_ROCM_AITER_PLUGIN_DEEP=1`` draws them all
(``bash scripts/nox -s deep``, run by the weekly ``deep`` workflow)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

DEEP_ENV = "VLLM_ROCM_AITER_PLUGIN_DEEP"


def deep() -> bool:
    return os.environ.get(DEEP_ENV, "") not in ("", "0")


def examples(full: int) -> int:
    """``full`` examples in a deep run, a tenth (at least 20, at most ``full``) otherwise."""
    return full if deep() else min(full, max(20, full // 10))


def randomised(full: int, **options: object) -> settings:
    """Hypothesis settings for a test whose full depth is ``full`` examples."""
    return settings(
        max_examples=examples(full), deadline=None, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        **options,
    )  # fmt: skip
