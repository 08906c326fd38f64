"""The cases issue reports named, on one emulated ROCm machine (``selection_property.machine``
runs :func:`facts` in its child process): what stock and the plugin's platform give, what the
plugin logs, whether the pick's impl constructs, and what the doctor says.
"""

from __future__ import annotations

import dataclasses
import os
import types
from typing import Any

from tests.helpers.selection_property import PluginLog, constructs, name_of

AITER_BACKENDS = ("ROCM_AITER_UNIFIED_ATTN", "ROCM_AITER_FA")
AITER_MLA_BACKENDS = ("ROCM_AITER_MLA", "ROCM_AITER_TRITON_MLA")
ROCM_ATTN_NAMES = ("ROCM_ATTN", "ROCM_FLASH", "ROCM_ATTN_VLLM_V1")
"""``ROCM_ATTN`` and the legacy names that select it."""
TURBOQUANT_RUN = "turboquant_k8v4"
DRAFT_BACKEND_FIELD = "attention_backend"
"""The ``SpeculativeConfig`` field through which a draft names its own backend (absent on the
oldest tested releases, where the draft shares the target's attention config)."""


def facts(arch: str, aiter: bool) -> dict[str, Any]:
    import typing

    import torch
    from vllm._aiter_ops import is_aiter_found_and_supported
    from vllm.config import SpeculativeConfig, set_current_vllm_config
    from vllm.config.cache import CacheDType
    from vllm.platforms.rocm import RocmPlatform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.selector import get_attn_backend

    from tests.helpers.doctor_answers import healthy_in_process_checks
    from vllm_rocm_aiter_plugin import env_backend
    from vllm_rocm_aiter_plugin.diagnostics import backend_choice, doctor, samples
    from vllm_rocm_aiter_plugin.diagnostics.backend_choice import KINDS, LayerKind
    from vllm_rocm_aiter_plugin.platform import AiterRocmPlatform

    log = PluginLog()
    capability = RocmPlatform.get_device_capability()

    def one(name: str, layer: Any, config: Any) -> dict[str, Any]:
        """The plugin's pick for ``VLLM_ATTENTION_BACKEND=name`` on ``layer``, as a fresh
        process makes it, beside stock's automatic pick and valid candidates."""
        os.environ[env_backend.ENV_VAR] = name
        env_backend._said.clear()
        log.records.clear()
        with set_current_vllm_config(config):
            stock = RocmPlatform.get_attn_backend_cls(None, layer)
            valid, _ = RocmPlatform.get_valid_backends(capability, layer)
            plugin = AiterRocmPlatform.get_attn_backend_cls(None, layer)
            built = constructs(
                lambda: AttentionBackendEnum[name_of(plugin)].get_class(), layer, aiter
            )
        return {
            "plugin": name_of(plugin), "stock": name_of(stock),
            "valid": [backend.name for backend, _ in valid], "constructs": built,
            "lines": log.lines(),
        }  # fmt: skip

    def layer_of(kind: LayerKind, kv_cache_dtype: str = "auto") -> Any:
        size = kind.fields.get("head_size", 128)
        return backend_choice.selector(kind, size, torch.bfloat16, kv_cache_dtype, None)

    plain = samples.tiny_vllm_config()
    encoder_decoder = samples.tiny_vllm_config(encoder_decoder=True)
    decoder, mla = KINDS[0], next(k for k in KINDS if k.label == "MLA layers")
    from vllm.platforms import current_platform

    found: dict[str, Any] = {
        "aiter_supported": is_aiter_found_and_supported(),
        "platform": type(current_platform).__qualname__,
        "capability": current_platform.get_device_capability().as_version_str(),
        "aiter_fa_import_error": _import_error(AttentionBackendEnum.ROCM_AITER_FA.get_class),
    }
    with set_current_vllm_config(plain):
        valid, _ = RocmPlatform.get_valid_backends(capability, layer_of(decoder))
    found["decoder_valid"] = [backend.name for backend, _ in valid]
    found["decoder"] = {n: one(n, layer_of(decoder), plain) for n in AITER_BACKENDS}
    found["mla"] = {n: one(n, layer_of(mla), plain) for n in AITER_MLA_BACKENDS}
    found["encoder_decoder"] = {
        kind.label: {n: one(n, layer_of(kind), encoder_decoder) for n in ROCM_ATTN_NAMES}
        for kind in KINDS
        if kind.encoder_decoder_model
    }
    if TURBOQUANT_RUN in typing.get_args(CacheDType):  # a run's boundary layer keeps "auto"
        run = samples.tiny_vllm_config(cache_dtype=TURBOQUANT_RUN)
        found["turboquant_boundary"] = one("ROCM_ATTN", layer_of(decoder), run)

    # The doctor, whole (its other checks answered as healthy): verdict lines and exit code
    found["doctor"] = {}
    for name in (*AITER_BACKENDS, *AITER_MLA_BACKENDS, "ROCM_ATTN", "TRITON_ATTN"):
        os.environ[env_backend.ENV_VAR] = name
        report = doctor.collect(healthy_in_process_checks())
        found["doctor"][name] = {
            "problems": report.problems, "notes": report.notes, "exit_code": report.exit_code,
        }  # fmt: skip

    # A speculative draft's selection, through vLLM's own draft config and selector
    os.environ[env_backend.ENV_VAR] = "TRITON_ATTN"
    target = samples.tiny_vllm_config(num_speculative_tokens=3)
    drafts = {"unnamed": target.speculative_config}
    if DRAFT_BACKEND_FIELD in {f.name for f in dataclasses.fields(SpeculativeConfig)}:
        drafts["ROCM_ATTN"] = SpeculativeConfig(  # --speculative-config '{..., "attention_backend": ...}'
            method="eagle", model=target.speculative_config.model, num_speculative_tokens=3,
            target_model_config=target.model_config, target_parallel_config=target.parallel_config,
            attention_backend=AttentionBackendEnum.ROCM_ATTN,
        )  # fmt: skip
    found["draft"] = {"made_by": draft_vllm_config_source(target.speculative_config)}
    for label, speculative in drafts.items():
        draft = draft_vllm_config(speculative, target)
        env_backend._said.clear()
        log.records.clear()
        with set_current_vllm_config(draft):
            chosen = get_attn_backend(128, torch.bfloat16, "auto")
        found["draft"][label] = {
            "backend": chosen.get_name(), "path": f"{chosen.__module__}.{chosen.__qualname__}",
            "config_backend": getattr(draft.attention_config.backend, "name", None),
            "lines": log.lines(),
        }  # fmt: skip
    return found


def _import_error(load: Any) -> str | None:
    """Why ``load()`` raises here (``type: message``), or None. vLLM 0.29-0.31's ROCM_AITER_FA
    module imports AITER's package on ROCm, whose import needs a ROCm install (``hipconfig``),
    which an emulated machine has not."""
    try:
        load()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def draft_vllm_config(speculative: Any, target: Any) -> Any:
    """The draft model's ``VllmConfig`` as the installed vLLM makes it: the speculative config's
    own ``apply_draft_overrides`` (0.34.0: model-runner V2's speculators), else the V1 proposer's
    ``_create_draft_vllm_config`` (0.23.0-0.33.0)."""
    apply = getattr(speculative, "apply_draft_overrides", None)
    if apply is not None:
        return apply(target)
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    proposer = types.SimpleNamespace(speculative_config=speculative, vllm_config=target)
    return SpecDecodeBaseProposer._create_draft_vllm_config(proposer)  # type: ignore[arg-type]


def draft_vllm_config_source(speculative: Any) -> str:
    if hasattr(speculative, "apply_draft_overrides"):
        return "SpeculativeConfig.apply_draft_overrides"
    return "SpecDecodeBaseProposer._create_draft_vllm_config"
