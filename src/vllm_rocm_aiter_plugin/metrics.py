"""The exposure counts on vLLM's ``/metrics``, in vLLM's naming: a stat logger that vLLM's API
server loads (the ``vllm.stat_logger_plugins`` entry point) and that adds what each engine's
counting process wrote (:mod:`.exposure`) to three counters. No ``PROMETHEUS_MULTIPROC_DIR``
needed: the counts come by file, the counters live in the API server's own registry."""

from __future__ import annotations

import json
import os
from typing import Any

from vllm.v1.metrics.loggers import StatLoggerBase

from vllm_rocm_aiter_plugin import exposure

COUNTERS = {
    "request_steps": (
        "vllm:rocm_aiter_fa_exposed_request_steps",
        "Request-steps that stock vLLM's ROCM_AITER_FA split serves without their cached context "
        "(mode=fixed: the plugin served them with it; mode=observed: stock served them so)",
    ),
    "steps": ("vllm:rocm_aiter_fa_exposed_steps", "Steps that held such requests"),
    "context_tokens": (
        "vllm:rocm_aiter_fa_unattended_context_tokens",
        "Cached tokens those request-steps would not attend (or did not, mode=observed)",
    ),
}
"""Each total, the counter's name (``_total`` is added on ``/metrics``) and its help."""

_counters: dict[str, Any] = {}


def _counter(total: str) -> Any:
    """The counter for ``total``, made on first use: ``PrometheusStatLogger`` removes every
    ``vllm:`` collector that exists when it starts."""
    if total not in _counters:
        from prometheus_client import Counter

        name, help_text = COUNTERS[total]
        _counters[total] = Counter(name, help_text, labelnames=["model_name", "engine", "mode"])
    return _counters[total]


class ExposureStatLogger(StatLoggerBase):
    """Adds engine ``engine_index``'s new exposure counts to the counters at each record."""

    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        self.engine = engine_index
        self.model_name = str(vllm_config.model_config.served_model_name)
        self.seen = {total: 0 for total in COUNTERS}
        self.stamp: float | None = None

    def record(self, *args: Any, **kwargs: Any) -> None:
        """Called by vLLM with each step's stats; reads the totals file when it changed."""
        path = exposure.channel_file(self.engine)
        try:
            stamp = os.stat(path).st_mtime_ns if path else None
            if stamp is None or stamp == self.stamp:
                return
            with open(path) as f:  # type: ignore[arg-type]
                totals = json.load(f)
        except (OSError, ValueError):  # nothing counted yet, or a write in progress
            return
        self.stamp = stamp
        mode = "observed" if totals.get("observed") else "fixed"
        for total in COUNTERS:
            new = int(totals.get(total, 0)) - self.seen[total]
            if new > 0:
                labels = {"model_name": self.model_name, "engine": str(self.engine), "mode": mode}
                _counter(total).labels(**labels).inc(new)
                self.seen[total] += new

    def log_engine_initialized(self) -> None:
        """Nothing to say at start: the counts are logged by the process that counts them."""
