"""The ROCM_AITER_FA metadata builder the plugin registers: vLLM's builder with the plugin's split.

Why each part exists and when it can go: ``docs/deviations.md``, "builder: ..." entries.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import textwrap
from collections.abc import Callable, Mapping
from typing import Any, cast

import numpy as np
import torch
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.attention.backends import rocm_aiter_fa as aiter_fa
from vllm.v1.attention.backends.rocm_aiter_fa import (
    AiterFlashAttentionMetadata,
    AiterFlashAttentionMetadataBuilder,
    rocm_aiter_ops,
)

from vllm_rocm_aiter_plugin import envs, exposure
from vllm_rocm_aiter_plugin import split as plugin_split
from vllm_rocm_aiter_plugin.log import logger
from vllm_rocm_aiter_plugin.rebind import NotRebindable, with_globals

SPLIT_GLOBAL_NAME = "split_decodes_prefills_and_extends"

VERIFIED_BUILD_FINGERPRINTS: dict[str, str] = {
    # sha256[:16] of the dedented source of AiterFlashAttentionMetadataBuilder.build -> the
    # releases that ship that source (read off each wheel: tests/unit/test_builder.py holds the
    # installed release's label to it, and compat runs it on every tested release). Each entry is
    # here because the differential tests passed on those releases (docs/releases.md).
    "b3a5951077f556d2": "0.20.0-0.21.0",
    "47315118f14dbfc4": "0.22.0-0.22.1",
    "ab2125a990db7e9a": "0.23.0-0.25.1",
    "f3f7a92e8dfc52bf": "0.26.0-0.28.0",
    "b8a50bc1402ac5b5": "0.29.0",
    "b1ce8d5f4cce7fb6": "0.30.0-0.31.0",
    "57f58c56fc465096": "0.32.0",
    "01dedefe29a05505": "0.33.0-0.34.0",
}


def build_fingerprint(build: Callable[..., Any] = AiterFlashAttentionMetadataBuilder.build) -> str:
    """First 16 hex digits of the sha256 of the build() source (Python-version independent)."""
    source = textwrap.dedent(inspect.getsource(build))
    return hashlib.sha256(source.encode()).hexdigest()[:16]


@functools.cache
def verified_release() -> str | None:
    """The releases whose build() source the installed vLLM has, if the own body was verified on
    it."""
    try:
        return VERIFIED_BUILD_FINGERPRINTS.get(build_fingerprint())
    except (OSError, TypeError):  # no source available
        return None


def own_build_default(environ: Mapping[str, str] | None = None) -> bool:
    """Whether builders created now run the own build unless told otherwise: a verified build()
    source and not switched off (``VLLM_ROCM_AITER_PLUGIN_OWN_BUILD``, :mod:`.envs`). ``force``
    runs it on an unverified source too: ``bash scripts/nox -s verify`` does that, to verify a
    release."""
    setting = envs.read(envs.OWN_BUILD, environ).value
    if setting is envs.Switch.FORCE:
        return True
    return setting is envs.Switch.ON and verified_release() is not None


def _vllm_build_with_plugin_split() -> Callable[..., Any]:
    """vLLM's ``build`` with the plugin's split; when its code cannot be rebound (a future vLLM),
    ``build`` unchanged with a WARNING: the backend stays importable and the doctor, which judges
    the builder by building batches, reports the fix as not working."""
    build = AiterFlashAttentionMetadataBuilder.build
    try:
        return with_globals(
            build, {SPLIT_GLOBAL_NAME: plugin_split.split_decodes_prefills_and_extends}
        )
    except NotRebindable as exc:
        logger().warning(
            "%s; outside the plugin's own build body ROCM_AITER_FA runs vLLM's build() "
            "unchanged (stock split). Run `vllm-rocm-aiter-plugin doctor`.",
            exc,
        )
        return build


def _fields(cls: type) -> frozenset[str]:
    return frozenset(field.name for field in dataclasses.fields(cls))


@dataclasses.dataclass(frozen=True)
class VllmBuildFeatures:
    """What the installed vLLM's metadata classes and this builder have, read once per builder."""

    metadata: frozenset[str]
    decode: frozenset[str]
    prefill: frozenset[str]
    extend: frozenset[str]
    chunks: frozenset[str]
    sliding_window: frozenset[str]
    asm_kv_scale_tables: bool  # 0.33: build() refreshes the fp8 scale tables first
    swa_decode_tables: bool  # 0.33: trimmed block tables for sliding-window decodes
    split_scales: bool  # 0.33: k_scale and v_scale; before, one ``scale`` for both

    @classmethod
    def of(cls, builder: AiterFlashAttentionMetadataBuilder) -> VllmBuildFeatures:
        return cls(
            metadata=_fields(aiter_fa.AiterFlashAttentionMetadata),
            decode=_fields(aiter_fa.AiterFlashAttentionDecodeMetadata),
            prefill=_fields(aiter_fa.AiterFlashAttentionPrefillMetadata),
            extend=_fields(aiter_fa.AiterFlashAttentionChunkPrefillMetadata),
            chunks=_fields(aiter_fa.AiterChunkContextMetadata),
            sliding_window=_fields(aiter_fa.AiterChunkSlidingWindowMetadata),
            asm_kv_scale_tables=hasattr(builder, "_build_asm_kv_scale_tables"),
            swa_decode_tables=hasattr(builder, "_build_swa_decode_tables"),
            split_scales=hasattr(builder, "k_scale"),
        )

    @property
    def host_seq_lens_always(self) -> bool:
        """0.20-0.21: the metadata carries host values of every sequence length, so stock copies
        them to the host on every build, pure decode included."""
        return "num_actual_kv_tokens" in self.metadata


@functools.cache
def _pin() -> bool:
    from vllm.utils.platform_utils import is_pin_memory_available

    return is_pin_memory_available()


def _to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Asynchronous host-to-device copy, staged through pinned memory where there is any."""
    if device.type == "cpu":
        return host
    if _pin() and not host.is_pinned():
        host = torch.empty(host.shape, dtype=host.dtype, pin_memory=True).copy_(host)
    return host.to(device, non_blocking=True)


class PluginAiterFlashAttentionMetadataBuilder(AiterFlashAttentionMetadataBuilder):
    """vLLM's ROCM_AITER_FA metadata builder, splitting batches with the plugin's split; each
    build counts the requests stock's split serves without their context (:mod:`.exposure`)."""

    vllm_build = staticmethod(_vllm_build_with_plugin_split())
    """The installed vLLM's ``build()`` code with the plugin's split (off the own build)."""
    observed = False
    """Whether the counted requests are served as stock serves them (observe mode)."""

    def __init__(self, *args: Any, own_build: bool | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.vllm_features = VllmBuildFeatures.of(self)
        # Decided once per builder (vLLM builds one per attention group at startup). The own build
        # does not reproduce KV-sharing state (0.30 onwards), a rare configuration.
        wanted = own_build_default() if own_build is None else own_build
        self.own_build = wanted and getattr(self, "kv_sharing_workspace", None) is None

    @property
    def threshold(self) -> int:
        """The decode threshold vLLM set on this builder (1 + speculative tokens)."""
        threshold = self.reorder_batch_threshold
        assert threshold is not None  # as stock's build() asserts
        return threshold

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> AiterFlashAttentionMetadata:
        if self.runs_own_build():
            return self._own_build(common_prefix_len, common_attn_metadata)
        count(self, common_attn_metadata, observed=self.observed)
        return self.vllm_build(self, common_prefix_len, common_attn_metadata, fast_build)

    def build_for_cudagraph_capture(self, common_attn_metadata: CommonAttentionMetadata) -> Any:
        with exposure.not_counted():  # a capture is not a step
            return super().build_for_cudagraph_capture(common_attn_metadata)

    def runs_own_build(self) -> bool:
        """Whether :meth:`build` runs the own build: ``own_build``, except under the shuffle
        KV-cache layout (``VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT``, process-wide; stock's build()
        reads it on every build too), whose scale state the own build does not keep on every
        release, so vLLM's build() code runs there."""
        return self.own_build and not rocm_aiter_ops.is_shuffle_kv_cache_enabled()

    # The own build. Each method mirrors the part of vLLM's build() it names; values a release's
    # metadata does not declare are neither computed nor passed.

    def _own_build(
        self, common_prefix_len: int, cam: CommonAttentionMetadata
    ) -> AiterFlashAttentionMetadata:
        features = self.vllm_features
        if features.asm_kv_scale_tables:
            self._build_asm_kv_scale_tables()
        split = plugin_split.split_batch(cam, self.threshold)
        exposure.record(split, False, self.vllm_config.parallel_config.data_parallel_rank)
        seq_lens = split.seq_lens
        if seq_lens is None and (
            features.host_seq_lens_always or split.num_extends or split.num_prefills
        ):
            seq_lens = plugin_split.exact_host_seq_lens(cam)
        if split.query_lens is not None:
            query_lens = split.query_lens
        else:  # pure decode: the offsets are read only here, never before the split
            qsl = cam.query_start_loc_cpu.numpy()
            query_lens = qsl[1:] - qsl[:-1]

        num_decodes, num_extends, num_prefills = (
            split.num_decodes,
            split.num_extends,
            split.num_prefills,
        )
        decode = None
        if num_decodes:
            decode = self._own_decode_metadata(cam, split, query_lens, seq_lens)
        prefill = None
        if num_prefills:
            assert seq_lens is not None
            rows = slice(num_decodes + num_extends, None)
            prefill = self._own_region_metadata(
                aiter_fa.AiterFlashAttentionPrefillMetadata,
                features.prefill,
                cam.query_start_loc[num_decodes + num_extends :],
                query_lens[rows],
                seq_lens[rows],
            )
        extend = None
        if num_extends:
            assert seq_lens is not None
            extend = self._own_extend_metadata(cam, split, query_lens, seq_lens)

        values: dict[str, Any] = dict(
            num_actual_tokens=cam.num_actual_tokens,
            query_start_loc=cam.query_start_loc,
            max_seq_len=cam.max_seq_len,
            seq_lens=cam.seq_lens,
            block_table=cam.block_table_tensor,
            causal=cam.causal,
            slot_mapping=cam.slot_mapping,
            num_decodes=num_decodes,
            num_decode_tokens=split.num_decode_tokens,
            num_prefills=num_prefills,
            num_extends=num_extends,
            num_extend_tokens=split.num_extend_tokens,
            decode_metadata=decode,
            prefill_metadata=prefill,
            extend_metadata=extend,
        )
        if features.split_scales:
            values.update(k_scale=self.k_scale, v_scale=self.v_scale)
        else:  # up to 0.32: one scale for both
            scale = getattr(self, "scale")  # noqa: B009 (an attribute of those releases only)
            values.update(k_scale=scale, v_scale=scale)
        declared = features.metadata
        if "use_cascade" in declared:  # up to 0.29
            values["use_cascade"] = common_prefix_len > 0
        if "kv_sharing_metadata" in declared:  # 0.30 onwards; the own body runs without sharing
            values["kv_sharing_metadata"] = None
        if features.host_seq_lens_always:  # 0.20-0.21
            assert seq_lens is not None
            values.update(
                num_actual_kv_tokens=int(seq_lens.sum()),
                max_query_len=cam.max_query_len,
                num_prefill_tokens=split.num_prefill_tokens,
                common_prefix_len=common_prefix_len,
                total_tokens=getattr(self, "total_tokens"),  # noqa: B009 (0.20-0.21 only)
            )
        return AiterFlashAttentionMetadata(**values)

    def _own_decode_metadata(
        self,
        cam: CommonAttentionMetadata,
        split: plugin_split.BatchSplit,
        query_lens: np.ndarray,
        seq_lens: torch.Tensor | None,
    ) -> Any:
        num_decodes = split.num_decodes
        decode_lens = query_lens[:num_decodes]
        # Read from the offsets, as stock does: a caller may understate max_query_len.
        max_query_len = decode_lens.item(decode_lens.argmax())
        declared = self.vllm_features.decode
        values: dict[str, Any] = {"max_query_len": max_query_len}
        if "uniform_query_len" in declared:  # 0.29
            uniform = split.num_decode_tokens == num_decodes * max_query_len
            values["uniform_query_len"] = max_query_len if uniform else None
        if "min_query_len" in declared:  # 0.20-0.21
            assert seq_lens is not None
            values.update(
                min_query_len=decode_lens.item(decode_lens.argmin()),
                max_seq_len=int(seq_lens[:num_decodes].max()),
                query_start_loc=cam.query_start_loc[: num_decodes + 1],
            )
        if self.vllm_features.swa_decode_tables:  # 0.33
            tables: tuple[Any, Any, int] = (None, None, 0)
            if max_query_len == 1:
                tables = self._build_swa_decode_tables(
                    cam.block_table_tensor, cam.seq_lens, num_decodes, cam.max_seq_len
                )
            values.update(
                swa_block_table=tables[0], swa_seq_lens=tables[1], swa_max_seq_len=tables[2]
            )
        return aiter_fa.AiterFlashAttentionDecodeMetadata(**values)

    def _own_region_metadata(
        self,
        cls: type,
        declared: frozenset[str],
        query_start_loc: torch.Tensor,
        query_lens: np.ndarray,
        seq_lens: torch.Tensor,
        **extra: Any,
    ) -> Any:
        """Prefill or extend metadata: the region's maxima and its rebased device offsets."""
        values = dict(
            max_query_len=query_lens.item(query_lens.argmax()),
            max_seq_len=int(seq_lens.max()),
            query_start_loc=query_start_loc - query_start_loc[0],
            **extra,
        )
        if "min_query_len" in declared:  # 0.20-0.21
            values["min_query_len"] = query_lens.item(query_lens.argmin())
        return cls(**values)

    def _own_extend_metadata(
        self,
        cam: CommonAttentionMetadata,
        split: plugin_split.BatchSplit,
        all_query_lens: np.ndarray,
        all_seq_lens: torch.Tensor,
    ) -> Any:
        start, num_extends = split.num_decodes, split.num_extends
        rows = slice(start, start + num_extends)
        query_lens = torch.from_numpy(all_query_lens[rows])  # query_start_loc_cpu's dtype
        seq_lens = all_seq_lens[rows]
        chunks = self._own_chunk_context(query_lens, seq_lens)
        return self._own_region_metadata(
            aiter_fa.AiterFlashAttentionChunkPrefillMetadata,
            self.vllm_features.extend,
            cam.query_start_loc[start : start + num_extends + 1],
            all_query_lens[rows],
            seq_lens,
            chunk_context_metadata=chunks,
        )

    def chunk_capacity(self, query_lens: torch.Tensor, context_lens: torch.Tensor) -> int:
        """Workspace tokens per extend row and context chunk."""
        moved = (context_lens == 0) & (query_lens > self.threshold)
        sharing = query_lens.shape[0] - int(moved.sum())
        return aiter_fa._CP_TOKENS_PER_ITER_ROCM // sharing

    def _own_chunk_context(self, query_lens: torch.Tensor, seq_lens: torch.Tensor) -> Any:
        device = self.device
        num_extends = query_lens.shape[0]
        context_lens = seq_lens - query_lens
        pin = _pin()
        features = self.vllm_features

        swa = None
        if self.aot_sliding_window is not None:
            swa_lens = torch.minimum(seq_lens, query_lens + self.aot_sliding_window[0] + 1)
            swa_cu = torch.zeros(num_extends + 1, dtype=torch.int32, pin_memory=pin)
            torch.cumsum(swa_lens, dim=0, dtype=torch.int32, out=swa_cu[1:])
            total = int(swa_cu[-1])
            token_to_seq = torch.repeat_interleave(
                torch.arange(num_extends, dtype=torch.int32), swa_lens
            )
            swa_values: dict[str, Any] = dict(
                swa_cu_seqlens=swa_cu.to(device, non_blocking=True),
                swa_seq_starts=_to_device(seq_lens - swa_lens, device),
                swa_token_to_batch=_to_device(token_to_seq, device),
                swa_max_seqlens=int(swa_lens.max()),
                swa_total_tokens=total,
                swa_workspace=torch.empty(
                    (2, total, self.num_heads_kv, self.headdim),
                    dtype=cast(torch.dtype, self.vllm_config.model_config.dtype),
                    device=device,
                ),
            )
            if "swa_seqlens" in features.sliding_window:  # 0.20-0.21
                swa_values["swa_seqlens"] = swa_lens.to(device, non_blocking=True)
            swa = aiter_fa.AiterChunkSlidingWindowMetadata(**swa_values)

        capacity = self.chunk_capacity(query_lens, context_lens)
        num_chunks = -(-int(context_lens.max()) // capacity)
        chunk_starts = (
            torch.arange(num_chunks, dtype=torch.int32).unsqueeze(1).expand(-1, num_extends)
            * capacity
        )
        chunk_lens = (
            torch.minimum(context_lens.unsqueeze(0), chunk_starts + capacity) - chunk_starts
        )
        chunk_lens.clamp_(min=0)  # [num_chunks, num_extends]
        cu_chunk = torch.zeros([num_chunks, num_extends + 1], dtype=torch.int32, pin_memory=pin)
        torch.cumsum(chunk_lens, dim=1, dtype=torch.int32, out=cu_chunk[:, 1:])
        chunk_totals = cu_chunk[:, -1]
        width = int(chunk_totals.max()) if num_chunks else 0
        values: dict[str, Any] = dict(
            workspace=self.extend_workspace,
            cu_seq_lens_chunk=cu_chunk.to(device, non_blocking=True),
            chunk_starts=_to_device(chunk_starts, device),
            token_to_batch=_to_device(token_to_request(cu_chunk, width), device),
            max_seq_lens=chunk_lens.max(dim=1).values.tolist(),
            num_chunks=num_chunks,
            total_token_per_batch=chunk_totals.tolist(),
            swa_metadata=swa,
        )
        if "seq_tot" in features.chunks:  # 0.20-0.21
            values.update(seq_tot=chunk_lens.sum(dim=1).tolist(), seq_lens=chunk_lens)
        return aiter_fa.AiterChunkContextMetadata(**values)


def count(
    builder: AiterFlashAttentionMetadataBuilder, cam: CommonAttentionMetadata, observed: bool
) -> None:
    """Count the step's rows stock's split serves without their context (:mod:`.exposure`);
    never raises into vLLM's build."""
    try:
        split = plugin_split.split_batch(cam, cast(int, builder.reorder_batch_threshold))
    except Exception:  # input the split refuses: stock's build() says what it makes of it
        return
    exposure.record(split, observed, builder.vllm_config.parallel_config.data_parallel_rank)


class ObservingAiterFlashAttentionMetadataBuilder(PluginAiterFlashAttentionMetadataBuilder):
    """Stock's builder: vLLM's ``build()`` unchanged (stock's split, never the own build),
    counting the requests its split serves without their context
    (``VLLM_ROCM_AITER_PLUGIN=observe``)."""

    vllm_build = staticmethod(AiterFlashAttentionMetadataBuilder.build)
    observed = True

    def runs_own_build(self) -> bool:
        return False


def token_to_request(cu_chunk: torch.Tensor, width: int) -> torch.Tensor:
    """[num_chunks, width] int64: for chunk c and workspace token t, how many of the chunk's requests
    end at or before t, i.e. the request the token belongs to. O(num_chunks x (requests + width)),
    where stock builds a [num_chunks, requests, width] boolean tensor."""
    num_chunks = cu_chunk.shape[0]
    ends = cu_chunk[:, 1:].numpy().astype(np.int64)
    rows = np.broadcast_to(np.arange(num_chunks, dtype=np.int64)[:, None], ends.shape)
    inside = ends < width
    counts = np.bincount((rows * width + ends)[inside], minlength=num_chunks * width)
    return torch.from_numpy(np.cumsum(counts.reshape(num_chunks, width), axis=1, dtype=np.int64))
