"""Run vLLM's real ROCM_AITER_FA forward for one step: its ``Attention`` layer, custom ops,
``AiterFlashAttentionImpl`` and its Triton kernels; only what needs ROCm is replaced
(:mod:`.reference_kernels`). vLLM's module and classes are never modified: where a method must
see something else (the gather and shuffle write vLLM defines only under ``is_rocm()``, a platform
answering another fp8 format, a ``rocm_aiter_ops`` serving the shuffle layout), it runs in a
subclass whose methods are copies with private globals (:mod:`..rebind`).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from vllm_rocm_aiter_plugin.diagnostics.forward import reference_kernels
from vllm_rocm_aiter_plugin.diagnostics.probe import SHUFFLE_WRITE_NAME
from vllm_rocm_aiter_plugin.rebind import loads_global, with_globals

INTERPRETER_ENV = {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
GATHER_NAME = "cp_mha_gather_cache"

MERGE_NAME = "merge_attn_states"
CACHE_WRITE_NAME = "triton_reshape_and_cache_flash"
CACHE_WRITE_QUANT_NAME = "triton_reshape_and_cache_flash_per_token_head_quant"
AITER_OPS_NAME = "rocm_aiter_ops"


@functools.cache
def vllm_rocm_kernel(name: str) -> tuple[Callable[..., Any] | None, str]:
    """vLLM's ROCm-only Triton function ``name`` of ``rocm_aiter_fa``: the module's own on ROCm,
    else loaded from its source (its ``if current_platform.is_rocm():`` block without the imports
    from AITER, which cannot load off ROCm, run in a copy of the module's namespace). Returns
    (function or None, where it came from or why it is missing)."""
    from vllm.v1.attention.backends import rocm_aiter_fa

    own = vars(rocm_aiter_fa).get(name)
    if own is not None:
        return own, "vLLM's (ROCm)"
    try:
        from vllm.triton_utils import HAS_TRITON
    except ImportError:
        HAS_TRITON = False
    if not HAS_TRITON:
        return None, "vLLM disabled Triton in this process (no interpreter environment)"
    namespace = _rocm_block_namespace()
    if name not in namespace:
        return None, f"this vLLM defines no {name} under is_rocm()"
    return namespace[name], "vLLM's Triton kernel, under the Triton interpreter"


@functools.cache
def _rocm_block_namespace() -> dict[str, Any]:
    from vllm.v1.attention.backends import rocm_aiter_fa

    tree = ast.parse(inspect.getsource(rocm_aiter_fa))
    blocks = [
        node
        for node in tree.body
        if isinstance(node, ast.If)
        and "is_rocm" in ast.unparse(node.test)
        and any(isinstance(n, ast.FunctionDef) and n.name == GATHER_NAME for n in node.body)
    ]
    if not blocks:
        return {}
    namespace = dict(vars(rocm_aiter_fa))
    body = [node for node in blocks[0].body if not _imports_aiter(node)]
    module = ast.Module(body=body, type_ignores=[])
    exec(compile(module, rocm_aiter_fa.__file__, "exec"), namespace)
    return namespace


def _imports_aiter(node: ast.stmt) -> bool:
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").split(".")[0] == "aiter"
    if isinstance(node, ast.Import):
        return any(alias.name.split(".")[0] == "aiter" for alias in node.names)
    return False


def _agree(agrees: bool, kernel: str, beyond: str = "") -> None:
    """``LauncherError`` where the reference of vLLM's ``kernel`` disagrees with the kernel."""
    if not agrees:
        raise reference_kernels.LauncherError(
            f"the reference {kernel} disagrees with vLLM's kernel{beyond}"
        )


def counters(wrapper: Gather | Merge | ShuffleWrite) -> dict[str, int]:
    """What a kernel's wrapper counted (its ``int`` fields): the report's record of what ran."""
    fields = dataclasses.fields(wrapper)
    return {f.name: getattr(wrapper, f.name) for f in fields if f.type in ("int", int)}


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
        by_reference = kwargs["key"][:count], kwargs["value"][:count]
        _agree(all(map(torch.equal, (key, value), by_reference)), GATHER_NAME)
        self.checked_tokens += count


@dataclass(eq=False)  # hashed by identity: the plugin caches its NaN probe per merge
class Merge:
    """vLLM's ``merge_attn_states`` under the interpreter: its Triton kernel on every token of a
    call up to ``budget`` tokens; above it, on the first ``budget`` tokens and on every token with
    two empty states or an lse of +inf or NaN (where releases differ), the reference on the rest,
    checked against the kernel on the tokens both ran (``LauncherError`` where they disagree)."""

    kernel: Callable[..., Any]
    budget: int | None  # None: no limit
    kernel_calls: int = 0
    budgeted_calls: int = 0
    checked_tokens: int = 0

    def __call__(self, output: torch.Tensor, prefix_output: torch.Tensor,
                 prefix_lse: torch.Tensor, suffix_output: torch.Tensor, suffix_lse: torch.Tensor,
                 output_lse: torch.Tensor | None = None, *args: Any, **kwargs: Any) -> None:  # fmt: skip
        states = (prefix_output, prefix_lse, suffix_output, suffix_lse)
        if self.budget is None or output.shape[0] <= self.budget or args or kwargs:
            self.kernel_calls += 1
            self.kernel(output, *states, output_lse, *args, **kwargs)
            return
        self.budgeted_calls += 1
        finite_or_empty = [
            lse.isfinite() | (lse == float("-inf")) for lse in (prefix_lse, suffix_lse)
        ]
        one_finite = prefix_lse.isfinite() | suffix_lse.isfinite()
        plain = (finite_or_empty[0] & finite_or_empty[1] & one_finite).all(0)
        by_kernel = ~plain
        by_kernel[: self.budget] = True
        rows = by_kernel.nonzero().squeeze(1)
        merged, lse = reference_kernels.merge_attn_states(*states)
        kernel_out = output[rows]
        kernel_lse = output_lse[:, rows] if output_lse is not None else None
        self.kernel(kernel_out, prefix_output[rows], prefix_lse[:, rows], suffix_output[rows],
                    suffix_lse[:, rows], kernel_lse)  # fmt: skip
        both = plain[rows]
        got, want = kernel_out[both].float(), merged[rows][both].to(output.dtype).float()
        bound = 2 * torch.finfo(output.dtype).eps * want.abs().clamp(min=1.0)
        _agree(bool(((got - want).abs() <= bound).all()), MERGE_NAME)
        self.checked_tokens += int(both.sum())
        output.copy_(merged.to(output.dtype))
        output[rows] = kernel_out
        if output_lse is not None and kernel_lse is not None:
            output_lse.copy_(lse)
            output_lse[:, rows] = kernel_lse


@dataclass
class ShuffleWrite:
    """The shuffle layout's cache write off ROCm: vLLM's Triton kernel, under the interpreter. A
    16-bit cache is written by the kernel and must equal the reference's. For an fp8 cache the
    reference writes the cache and the kernel a copy, which must agree up to the interpreter's
    float32-to-fp8 conversion (no round to nearest even: one fp8 step on about 0.5% of values; a lost
    carry into the next power of two: half that power); anything else raises ``LauncherError``.
    A write of more than ``budget`` tokens is checked so on its first ``budget`` tokens, and the
    reference writes it whole."""

    kernel: Callable[..., Any] | None
    budget: int | None = None  # None: no limit; else the kernel writes the first tokens only
    kernel_calls: int = 0
    reference_calls: int = 0  # fp8 caches: the reference's write is kept
    budgeted_calls: int = 0
    interpreter_carry_losses: int = 0
    interpreter_rounding_steps: int = 0

    def __call__(self, *args: Any) -> None:
        (key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scales,
         v_scales) = args  # fmt: skip
        if self.kernel is None:
            raise reference_kernels.LauncherError(
                "no reshape_and_cache_shuffle_triton in this process"
            )
        count = slot_mapping.shape[0]
        if self.budget is not None and count > self.budget:
            count = self.budget  # the kernel on the first tokens, the reference on all
            self.budgeted_calls += 1
            whole = (key_cache.clone(), value_cache.clone())
            reference_kernels.reshape_and_cache_flash(
                key, value, *whole, slot_mapping, kv_cache_dtype, k_scales, v_scales, shuffle=True
            )
            self(key[:count], value[:count], key_cache, value_cache, slot_mapping[:count],
                 kv_cache_dtype, k_scales, v_scales)  # fmt: skip
            key_cache.copy_(whole[0])
            value_cache.copy_(whole[1])
            return
        expected = (key_cache.clone(), value_cache.clone())
        reference_kernels.reshape_and_cache_flash(
            key, value, *expected, slot_mapping, kv_cache_dtype, k_scales, v_scales, shuffle=True
        )
        self.kernel_calls += 1
        written = [key_cache.clone(), value_cache.clone()]
        self.kernel(key, value, *written, slot_mapping, kv_cache_dtype, k_scales, v_scales)
        fp8 = key_cache.dtype in reference_kernels.FP8_DTYPES
        for want, got in zip(expected, written, strict=True):
            differ = want.view(torch.uint8) != got.view(torch.uint8)
            _agree(fp8 or not bool(differ.any()), SHUFFLE_WRITE_NAME)
            if not bool(differ.any()):
                continue
            wanted, gotten = want[differ].float(), got[differ].float()
            exponent = wanted.abs().log2()
            carry_lost = (exponent == exponent.round()) & (gotten == wanted / 2)
            smallest = torch.finfo(key_cache.dtype).smallest_normal
            step = torch.exp2(exponent.floor().clamp(min=math.log2(smallest)) - 3)
            one_step = (gotten - wanted).abs() <= step
            _agree(bool((carry_lost | one_step).all()), SHUFFLE_WRITE_NAME,
                   " beyond the interpreter's fp8 conversion")  # fmt: skip
            self.interpreter_carry_losses += int(carry_lost.sum())
            self.interpreter_rounding_steps += int((one_step & ~carry_lost).sum())
        if fp8:
            self.reference_calls += 1
            key_cache.copy_(expected[0])
            value_cache.copy_(expected[1])
        else:
            key_cache.copy_(written[0])
            value_cache.copy_(written[1])

    def ignores_kv_scales(self, fp8_dtype: torch.dtype, device: torch.device) -> bool:
        """Whether vLLM's kernel stores fp8 values without dividing them by the layer's KV scales
        (0.30's kernel sets both to 1): one token written with scales of 1 and of 2."""
        if self.kernel is None:
            raise reference_kernels.LauncherError(
                "no reshape_and_cache_shuffle_triton in this process"
            )
        stored = []
        for scale in (1.0, 2.0):
            token = torch.full((1, 1, 64), 4.0, dtype=torch.float16, device=device)
            caches = [torch.zeros(1, 16, 1, 64, dtype=fp8_dtype, device=device) for _ in range(2)]
            scales = [torch.tensor([scale], dtype=torch.float32, device=device) for _ in range(2)]
            slot = torch.zeros(1, dtype=torch.int64, device=device)
            self.kernel(token, token.clone(), *caches, slot, "fp8", *scales)
            stored.append(float(caches[0].float().abs().max()))
        return stored[0] == stored[1]


@dataclass
class UnifiedAttention:
    """What vLLM's decode path calls as AITER's ``unified_attention`` off ROCm: ``function`` (the
    torch reference; the tests give AITER's own Triton kernel) behind the argument checks of
    :func:`.reference_kernels.check_unified_attention`, counting its calls."""

    function: Callable[..., None]
    origin: str
    is_aiter: bool = False
    calls: int = 0

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 **kwargs: Any) -> None:  # fmt: skip
        reference_kernels.check_unified_attention(q, out, **kwargs)
        self.calls += 1
        self.function(q=q, k=k, v=v, out=out, **kwargs)

    def to_json(self) -> dict[str, Any]:
        return {"kernel": self.origin, "aiter": self.is_aiter, "calls": self.calls}


def shuffle_layout_ops() -> type:
    """vLLM's ``rocm_aiter_ops`` answering True to ``is_shuffle_kv_cache_enabled()`` (a subclass),
    for vLLM's methods' private globals; the process's own flag is left as it is."""
    from vllm._aiter_ops import rocm_aiter_ops

    return type(
        "RocmAiterOpsWithShuffleLayout",
        (rocm_aiter_ops,),
        {"is_shuffle_kv_cache_enabled": classmethod(lambda cls: True)},
    )


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


class PlatformAsRocm(PlatformWithFp8):
    """vLLM's ``current_platform`` answering ``is_rocm()`` (for a Triton launch's tuning branch,
    whose CUDA side asks the device's capability; the interpreter needs no device)."""

    def __init__(self, platform: Any):
        super().__init__(platform, platform.fp8_dtype())

    def is_rocm(self) -> bool:
        return True


def runnable_without_split(backend_cls: Any) -> Any:
    """A backend without the three-way split (``TRITON_ATTN``) whose impl's cache write launches
    as on ROCm (:class:`PlatformAsRocm`); ``backend_cls`` itself where its impl needs none."""
    from vllm.platforms import current_platform

    impl_cls = backend_cls.get_impl_cls()
    module = vars(inspect.getmodule(impl_cls))
    writes = {name: module[name] for name in (CACHE_WRITE_NAME, CACHE_WRITE_QUANT_NAME)
              if name in module}  # fmt: skip
    if current_platform.is_rocm() or not writes:
        return backend_cls
    platform = {"current_platform": PlatformAsRocm(current_platform)}
    replacements = {name: with_globals(write, platform) for name, write in writes.items()}
    impl = _with_vllm_globals(impl_cls, impl_cls, replacements, "Runnable")
    return type(backend_cls.__name__, (backend_cls,), {"get_impl_cls": staticmethod(lambda: impl)})


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
    impl_cls: type,
    gather: Gather | None,
    fp8_dtype: torch.dtype | None = None,
    shuffle_write: ShuffleWrite | None = None,
    merge: Merge | None = None,
) -> type:
    """``impl_cls`` whose methods (vLLM's and its own) that read ``cp_mha_gather_cache``,
    ``current_platform`` or, with ``shuffle_write``, ``rocm_aiter_ops`` and the shuffle write see
    ``gather``, :func:`platform_globals` and :func:`shuffle_layout_ops`, where this process lacks them,
    and ``merge`` where given; ``impl_cls`` itself where it needs none."""
    from vllm.v1.attention.backends import rocm_aiter_fa
    from vllm.v1.attention.backends.rocm_aiter_fa import AiterFlashAttentionImpl

    replacements = platform_globals(fp8_dtype)
    if GATHER_NAME not in vars(rocm_aiter_fa):
        if gather is None:
            raise RuntimeError("no cp_mha_gather_cache in this process; pass a Gather")
        replacements[GATHER_NAME] = gather
    if shuffle_write is not None:
        replacements[AITER_OPS_NAME] = shuffle_layout_ops()
        if SHUFFLE_WRITE_NAME not in vars(rocm_aiter_fa):
            replacements[SHUFFLE_WRITE_NAME] = shuffle_write
    if merge is not None:
        replacements[MERGE_NAME] = merge
    return _with_vllm_globals(impl_cls, AiterFlashAttentionImpl, replacements, "Runnable")


def _with_vllm_globals(cls: type, vllm_cls: type, replacements: dict[str, Any], tag: str) -> type:
    """``cls`` (``vllm_cls`` or a subclass of it) whose methods, vLLM's and its own, that read
    any of ``replacements`` as globals see them (private copies: :func:`with_globals`)."""
    if not replacements:
        return cls

    def rebound(owner: type) -> dict[str, Any]:
        methods: dict[str, Any] = {}
        for name, attribute in vars(owner).items():
            wrapper = type(attribute) if isinstance(attribute, staticmethod | classmethod) else None
            function = attribute.__func__ if wrapper is not None else attribute
            if not inspect.isfunction(function):
                continue
            read = {k: v for k, v in replacements.items() if loads_global(function.__code__, k)}
            if read:
                copy = with_globals(function, read)
                methods[name] = wrapper(copy) if wrapper is not None else copy
        return methods

    bound = type(f"{vllm_cls.__name__}{tag}", (vllm_cls,), rebound(vllm_cls))
    if cls is vllm_cls:
        return bound
    own: dict[str, Any] = {}
    for owner in reversed(cls.__mro__[: cls.__mro__.index(vllm_cls)]):
        own.update(rebound(owner))
    return type(f"{cls.__name__}{tag}", (cls, bound), own)


def runnable_builder(builder_cls: type, shuffle: bool) -> type:
    """``builder_cls`` whose methods (vLLM's ``build()`` and scale tables, the plugin's own) see
    :func:`shuffle_layout_ops` where ``shuffle``."""
    from vllm.v1.attention.backends.rocm_aiter_fa import AiterFlashAttentionMetadataBuilder

    replacements = {AITER_OPS_NAME: shuffle_layout_ops()} if shuffle else {}
    return _with_vllm_globals(
        builder_cls, AiterFlashAttentionMetadataBuilder, replacements, "Shuffle"
    )


def runnable_backend(
    backend_cls: Any,
    gather: Gather | None,
    fp8_dtype: torch.dtype | None = None,
    shuffle_write: ShuffleWrite | None = None,
    merge: Merge | None = None,
) -> Any:
    """``backend_cls`` with :func:`runnable_impl` of its impl and :func:`runnable_builder` of its
    builder (the rest unchanged)."""
    impl = runnable_impl(backend_cls.get_impl_cls(), gather, fp8_dtype, shuffle_write, merge)
    builder = runnable_builder(backend_cls.get_builder_cls(), shuffle_write is not None)
    if impl is backend_cls.get_impl_cls() and builder is backend_cls.get_builder_cls():
        return backend_cls
    return type(
        backend_cls.__name__,
        (backend_cls,),
        {
            "get_impl_cls": staticmethod(lambda: impl),
            "get_builder_cls": staticmethod(lambda: builder),
        },
    )


def allocate_kv_cache(
    backend: Any,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_size: int,
    dtype: torch.dtype,
    device: torch.device,
    shuffle: bool = False,
) -> torch.Tensor:
    """A zeroed KV cache in the layout the backend asks for: its ``get_kv_cache_shape`` (0.20-0.28),
    else ``[blocks, kv_heads, block_size, 2 * head_size]`` in the layout vLLM picks for it
    (``ROCM_AITER_FA``: LBHNC). Under the shuffle layout from 0.29 on, K and V as two dense
    planes of pages (``customize_spec``'s head slots, LHBNC)."""
    if shuffle and not hasattr(backend, "get_kv_cache_shape"):
        planes = torch.zeros(
            2, num_blocks, block_size, num_kv_heads * head_size, dtype=dtype, device=device
        )
        return planes.transpose(0, 1)
    try:
        shape = backend.get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size)
    except (AttributeError, NotImplementedError):
        from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts

        # The layout vLLM's worker picks for this backend alone: the per-layer view stays
        # logical [blocks, kv_heads, block_size, 2 * head_size], its memory in the layout's order
        order = get_supported_kv_cache_layouts([backend])[0].layer_view_order
        logical = (num_blocks, num_kv_heads, block_size, 2 * head_size)
        physical = torch.zeros([logical[axis] for axis in order], dtype=dtype, device=device)
        return physical.permute([order.index(axis) for axis in range(len(order))])
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
    """``Attention.forward`` in vLLM's forward context, through the custom ops as on ROCm;
    [tokens, heads, head_size]."""
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
