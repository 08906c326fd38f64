"""Run vLLM's real ROCM_AITER_FA forward for one step: its ``Attention`` layer, custom ops,
``AiterFlashAttentionImpl`` (``do_kv_cache_update``, ``forward``, ``extend_forward``, the
sliding-window path) and its Triton kernels; only what needs ROCm is replaced
(:mod:`.reference_kernels`).

On CPU the Triton kernels run under Triton's interpreter: the process must start with
``TRITON_INTERPRET=1`` and ``CUDA_VISIBLE_DEVICES`` set but empty (``INTERPRETER_ENV``; vLLM
otherwise disables Triton when no driver is active). vLLM defines ``cp_mha_gather_cache`` only
under ``current_platform.is_rocm()``; off ROCm it is loaded from the installed module's own source
and given to vLLM's methods through a private copy of their globals (:mod:`..rebind`): vLLM's
module and classes are never modified. Gather calls larger than a token budget run the torch
reference, and vLLM's kernel on the first ``budget`` tokens of that call is checked against it.

An fp8 cache is viewed as ``current_platform.fp8_dtype()``. Off ROCm that is OCP's
``float8_e4m3fn`` (gfx950's); a case in MI300's ``float8_e4m3fnuz`` gives the same methods a
platform answering that format (:class:`PlatformWithFp8`), in the same private globals. On ROCm
the hardware's format is the only one, and a case in another cannot run there.
"""

from __future__ import annotations

import ast
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from vllm_rocm_aiter_plugin.diagnostics.forward import reference_kernels
from vllm_rocm_aiter_plugin.rebind import loads_global, with_globals

INTERPRETER_ENV = {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
GATHER_NAME = "cp_mha_gather_cache"


@functools.cache
def vllm_gather_kernel() -> tuple[Callable[..., Any] | None, str]:
    """vLLM's ``cp_mha_gather_cache``: the module's own on ROCm, else loaded from its source (the
    body of its ``if current_platform.is_rocm():`` block without its imports from AITER, which
    cannot load off ROCm and which the gather kernel does not use; 0.29-0.32 import AITER's
    Gluon decode there; run in a copy of the module's namespace). Returns (function or None,
    where it came from or why it is missing)."""
    from vllm.v1.attention.backends import rocm_aiter_fa

    own = vars(rocm_aiter_fa).get(GATHER_NAME)
    if own is not None:
        return own, "vLLM's (ROCm)"
    try:
        from vllm.triton_utils import HAS_TRITON
    except ImportError:
        HAS_TRITON = False
    if not HAS_TRITON:
        return None, "vLLM disabled Triton in this process (no interpreter environment)"
    source = inspect.getsource(rocm_aiter_fa)
    tree = ast.parse(source)
    blocks = [
        node
        for node in tree.body
        if isinstance(node, ast.If)
        and "is_rocm" in ast.unparse(node.test)
        and any(isinstance(n, ast.FunctionDef) and n.name == GATHER_NAME for n in node.body)
    ]
    if not blocks:
        return None, "this vLLM defines no cp_mha_gather_cache under is_rocm()"
    namespace = dict(vars(rocm_aiter_fa))
    body = [node for node in blocks[0].body if not _imports_aiter(node)]
    module = ast.Module(body=body, type_ignores=[])
    exec(compile(module, rocm_aiter_fa.__file__, "exec"), namespace)
    return namespace[GATHER_NAME], "vLLM's Triton kernel, under the Triton interpreter"


def _imports_aiter(node: ast.stmt) -> bool:
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").split(".")[0] == "aiter"
    if isinstance(node, ast.Import):
        return any(alias.name.split(".")[0] == "aiter" for alias in node.names)
    return False


@dataclass
class Gather:
    """The ``cp_mha_gather_cache`` the impl calls off ROCm: vLLM's kernel up to ``budget`` tokens
    per call; above it the reference, checked against vLLM's kernel on its first tokens."""

    kernel: Callable[..., Any] | None
    budget: int | None  # None: no limit
    kernel_calls: int = 0
    reference_calls: int = 0
    checked_tokens: int = 0
    log: list[str] = field(default_factory=list)

    def __call__(self, **kwargs: Any) -> None:
        total = kwargs["total_tokens"]
        if self.kernel is not None and (self.budget is None or total <= self.budget):
            self.kernel_calls += 1
            self.kernel(**kwargs)
            return
        self.reference_calls += 1
        reference_kernels.cp_mha_gather_cache(**kwargs)
        if self.kernel is None or not total:
            return
        count = min(total, self.budget or total)
        key, value = (
            torch.empty_like(kwargs["key"][:count]),
            torch.empty_like(kwargs["value"][:count]),
        )
        self.kernel(**{**kwargs, "key": key, "value": value, "total_tokens": count})
        if not (
            torch.equal(key, kwargs["key"][:count]) and torch.equal(value, kwargs["value"][:count])
        ):
            raise reference_kernels.LauncherError(
                "the reference cp_mha_gather_cache disagrees with vLLM's kernel"
            )
        self.checked_tokens += count


class PlatformWithFp8:
    """vLLM's ``current_platform`` with another answer to ``fp8_dtype()`` (every other attribute
    is the platform's own)."""

    def __init__(self, platform: Any, fp8_dtype: torch.dtype):
        self._platform = platform
        self._fp8_dtype = fp8_dtype

    def fp8_dtype(self) -> torch.dtype:
        return self._fp8_dtype

    def __getattr__(self, name: str) -> Any:
        return getattr(self._platform, name)


def platform_globals(fp8_dtype: torch.dtype | None) -> dict[str, Any]:
    """The ``current_platform`` the impl's methods must see for an fp8 cache of ``fp8_dtype``
    (empty where the platform's own answer is that format)."""
    from vllm.platforms import current_platform

    if fp8_dtype is None or current_platform.fp8_dtype() == fp8_dtype:
        return {}
    if current_platform.is_rocm():
        raise RuntimeError(
            f"this GPU's fp8 format is {current_platform.fp8_dtype()}, not {fp8_dtype}"
        )
    return {"current_platform": PlatformWithFp8(current_platform, fp8_dtype)}


def runnable_impl(
    impl_cls: type, gather: Gather | None, fp8_dtype: torch.dtype | None = None
) -> type:
    """``impl_cls`` itself where vLLM has its gather kernel and the platform's fp8 format is
    ``fp8_dtype``; elsewhere a subclass whose vLLM methods that call ``cp_mha_gather_cache``
    (``extend_forward``, the sliding-window path) see ``gather`` and whose methods that read
    ``current_platform`` see :func:`platform_globals`. The class's own overrides stay in front
    of them (its ``super()`` reaches them)."""
    from vllm.v1.attention.backends import rocm_aiter_fa
    from vllm.v1.attention.backends.rocm_aiter_fa import AiterFlashAttentionImpl

    replacements = platform_globals(fp8_dtype)
    if GATHER_NAME not in vars(rocm_aiter_fa):
        if gather is None:
            raise RuntimeError("no cp_mha_gather_cache in this process; pass a Gather")
        replacements[GATHER_NAME] = gather
    if not replacements:
        return impl_cls
    methods = {}
    for name, function in vars(AiterFlashAttentionImpl).items():
        if not inspect.isfunction(function):
            continue
        read = {k: v for k, v in replacements.items() if loads_global(function.__code__, k)}
        if read:
            methods[name] = with_globals(function, read)
    bound = type("AiterFlashAttentionImplWithGather", (AiterFlashAttentionImpl,), methods)
    if impl_cls is AiterFlashAttentionImpl:
        return bound
    return type(f"{impl_cls.__name__}WithGather", (impl_cls, bound), {})


def runnable_backend(
    backend_cls: Any, gather: Gather | None, fp8_dtype: torch.dtype | None = None
) -> Any:
    """``backend_cls`` with :func:`runnable_impl` of its impl (builder and the rest unchanged)."""
    impl = runnable_impl(backend_cls.get_impl_cls(), gather, fp8_dtype)
    if impl is backend_cls.get_impl_cls():
        return backend_cls
    return type(backend_cls.__name__, (backend_cls,), {"get_impl_cls": staticmethod(lambda: impl)})


def allocate_kv_cache(
    backend: Any,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_size: int,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """A zeroed KV cache in the layout the backend asks for: its ``get_kv_cache_shape`` where it
    has one (0.20-0.28), else the logical ``[blocks, kv_heads, block_size, 2 * head_size]`` in its
    first supported layout (0.29 onwards, LBHNC: that shape, contiguous)."""
    try:
        shape = backend.get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size)
    except (AttributeError, NotImplementedError):
        layouts = backend.supported_kv_cache_layouts()
        if layouts[0].name != "LBHNC":
            raise RuntimeError(f"KV-cache layout {layouts[0].name} is not handled here") from None
        shape = (num_blocks, num_kv_heads, block_size, 2 * head_size)
    return torch.zeros(shape, dtype=dtype, device=device)


def bind_kv_cache(vllm_config: Any, layer_name: str, kv_cache: torch.Tensor) -> None:
    """vLLM's own ``bind_kv_cache``: the layer reads its cache from the forward context."""
    from vllm.v1.worker.utils import bind_kv_cache as vllm_bind

    vllm_bind({layer_name: kv_cache}, vllm_config.compilation_config.static_forward_context, [])


def layer_forward(
    vllm_config: Any,
    layer: Any,
    metadata: Any,
    slot_mapping: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
) -> torch.Tensor:
    """``Attention.forward`` inside vLLM's forward context, through the custom ops
    (``torch.ops.vllm.unified_kv_cache_update`` / ``unified_attention_with_output``) as on ROCm.
    Returns [tokens, heads, head_size]."""
    from vllm.forward_context import set_forward_context

    layer.use_direct_call = False  # this layer object only: ROCm goes through the custom ops
    num_tokens, num_heads, head_size = query.shape
    kwargs: dict[str, Any] = {}
    if "slot_mapping" in inspect.signature(set_forward_context).parameters:
        kwargs["slot_mapping"] = {layer.layer_name: slot_mapping}
    with set_forward_context({layer.layer_name: metadata}, vllm_config, **kwargs):
        out = layer(query.reshape(num_tokens, -1), key.reshape(num_tokens, -1),
                    value.reshape(num_tokens, -1))  # fmt: skip
    return out.view(num_tokens, num_heads, head_size)
