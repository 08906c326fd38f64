"""The ROCM_AITER_FA metadata builder with the plugin's split.

``PluginAiterFlashAttentionMetadataBuilder.build`` runs one of two bodies:
- on a vLLM whose ``build()`` source the plugin verified (:mod:`.own_build`), its own faster build
  code, which produces the metadata vLLM's ``build()`` would with the same split;
- everywhere else, the installed vLLM's own ``AiterFlashAttentionMetadataBuilder.build`` (same code
  object, so every upstream change to the body applies), evaluated in a private copy of its module
  namespace in which the single global name ``split_decodes_prefills_and_extends`` resolves to
  :mod:`vllm_rocm_aiter_plugin.split`. Nothing in vLLM is modified.

Why, the upstream PRs, and when each part can go: ``docs/deviations.md``, entries 7-9.
"""

from __future__ import annotations

import dis
import types
from collections.abc import Callable
from typing import Any

from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.attention.backends.rocm_aiter_fa import (
    AiterFlashAttentionMetadata,
    AiterFlashAttentionMetadataBuilder,
)

from vllm_rocm_aiter_plugin import own_build
from vllm_rocm_aiter_plugin import split as plugin_split

SPLIT_GLOBAL_NAME = "split_decodes_prefills_and_extends"


class StockBuildNotRebindable(RuntimeError):
    """The installed vLLM's ``build()`` no longer looks up the split as a module global."""


def rebind_split(function: Callable[..., Any], split: Callable[..., Any]) -> Callable[..., Any]:
    """A copy of ``function`` whose global ``split_decodes_prefills_and_extends`` is ``split``.

    The copy shares ``function``'s code object, defaults and closure; only its globals differ (a
    snapshot of the defining module's namespace with one name replaced). Raises
    ``StockBuildNotRebindable`` if the code does not look the split up as a global.
    """
    code = function.__code__
    if not _loads_global(code, SPLIT_GLOBAL_NAME) or SPLIT_GLOBAL_NAME not in function.__globals__:
        raise StockBuildNotRebindable(
            f"{function.__module__}.{function.__qualname__} does not call "
            f"{SPLIT_GLOBAL_NAME} through a module global"
        )
    namespace = dict(function.__globals__)
    namespace[SPLIT_GLOBAL_NAME] = split
    rebound = types.FunctionType(
        code, namespace, function.__name__, function.__defaults__, function.__closure__
    )
    rebound.__kwdefaults__ = function.__kwdefaults__
    rebound.__qualname__ = function.__qualname__
    rebound.__doc__ = function.__doc__
    rebound.__annotations__ = dict(function.__annotations__)
    rebound.__wrapped__ = function  # type: ignore[attr-defined]
    return rebound


def _loads_global(code: types.CodeType, name: str) -> bool:
    """Whether ``code`` reads ``name`` as a global (``LOAD_GLOBAL``), as opposed to an attribute
    of the same name (``module.name``), which ``co_names`` would list too."""
    return any(
        instruction.opname == "LOAD_GLOBAL" and instruction.argval == name
        for instruction in dis.get_instructions(code)
    )


def build_with_plugin_split(build: Callable[..., Any]) -> Callable[..., Any]:
    """vLLM's ``build`` with the plugin's split, or, when its code cannot be rebound (a future
    vLLM), ``build`` unchanged with a WARNING: the backend stays importable and the doctor, which
    judges the builder by building batches, reports the fix as not working."""
    try:
        return rebind_split(build, plugin_split.split_decodes_prefills_and_extends)
    except StockBuildNotRebindable as exc:
        from vllm.logger import init_logger

        from vllm_rocm_aiter_plugin.policy import LOGGER_NAME

        init_logger(LOGGER_NAME).warning(
            "%s; outside the plugin's own build path ROCM_AITER_FA runs vLLM's build() "
            "unchanged (stock split). Run `vllm-rocm-aiter-plugin doctor`.",
            exc,
        )
        return build


class PluginAiterFlashAttentionMetadataBuilder(AiterFlashAttentionMetadataBuilder):
    """vLLM's ROCM_AITER_FA metadata builder, splitting batches with the plugin's split.

    Returns vLLM's own ``AiterFlashAttentionMetadata`` (EAGLE checks it with ``isinstance``).
    Pure-decode batches, EAGLE's included, build without reading ``seq_lens_cpu_upper_bound`` and
    without a device-to-host copy. See the module docstring for why and when this goes away.

    On a vLLM whose ``build()`` source the plugin verified (see :mod:`.own_build`), the plugin's
    own, faster build code produces the same metadata; everywhere else, vLLM's ``build()`` runs.
    """

    vllm_build = staticmethod(build_with_plugin_split(AiterFlashAttentionMetadataBuilder.build))
    """The installed vLLM's ``build()`` code with the plugin's split (off the own build path)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Decided once per builder (vLLM builds one per attention group at startup): the kill
        # switch and the builder's own state do not change afterwards, and reading the
        # environment on every build() is a measurable share of a pure-decode build.
        self.uses_own_build = own_build.enabled() and own_build.handles(self)

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> AiterFlashAttentionMetadata:
        if self.uses_own_build and own_build.handles_kv_layout():
            return own_build.build(self, common_prefix_len, common_attn_metadata)
        return self.vllm_build(self, common_prefix_len, common_attn_metadata, fast_build)
