"""The plugin builder on a real VllmConfig, against vLLM's stock builder."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from vllm.v1.attention.backends import rocm_aiter_fa
from vllm.v1.attention.backends import utils as stock_utils
from vllm.v1.attention.backends.rocm_aiter_fa import (
    AiterFlashAttentionBackend,
    AiterFlashAttentionMetadata,
    AiterFlashAttentionMetadataBuilder,
)

from tests.helpers import vllm_releases
from tests.helpers.batches import reordered_batches
from tests.helpers.depth import randomised
from tests.helpers.metadata_compare import assert_same_metadata
from vllm_rocm_aiter_plugin import builder as builder_module
from vllm_rocm_aiter_plugin import envs, releases
from vllm_rocm_aiter_plugin.backend import PluginAiterFlashAttentionBackend
from vllm_rocm_aiter_plugin.builder import PluginAiterFlashAttentionMetadataBuilder
from vllm_rocm_aiter_plugin.diagnostics import probe, samples
from vllm_rocm_aiter_plugin.diagnostics.cpu_host import unpinned_host_memory
from vllm_rocm_aiter_plugin.diagnostics.forward.cases import ForwardCase, Request
from vllm_rocm_aiter_plugin.diagnostics.forward.steps import laid_out
from vllm_rocm_aiter_plugin.rebind import NotRebindable, with_globals


def _builder(cls, vllm_config, device="cpu"):
    return cls(samples.kv_cache_spec(vllm_config), [], vllm_config, torch.device(device))


def _build(cls, vllm_config, batch):
    with unpinned_host_memory():  # the extend path pins host buffers; no pinning without a GPU
        return _builder(cls, vllm_config).build(common_prefix_len=0, common_attn_metadata=batch)


def _stock_or_error(vllm_config, batch):
    try:
        return _build(AiterFlashAttentionMetadataBuilder, vllm_config, batch), None
    except AssertionError as exc:
        return None, exc


def test_thresholds_come_from_the_real_config(vllm_config, eagle_vllm_config):
    assert (
        _builder(PluginAiterFlashAttentionMetadataBuilder, vllm_config).reorder_batch_threshold == 1
    )
    assert (
        _builder(
            PluginAiterFlashAttentionMetadataBuilder, eagle_vllm_config
        ).reorder_batch_threshold
        == 4
    )


@pytest.mark.parametrize("config_name, query_len", [("vllm_config", 1), ("eagle_vllm_config", 4)])
def test_pure_decode_without_upper_bound(request, config_name, query_len):
    vllm_config = request.getfixturevalue(config_name)
    batch = samples.make_batch(
        [query_len] * 6, [30 + 9 * i for i in range(6)], with_upper_bound=False
    )
    meta = _build(PluginAiterFlashAttentionMetadataBuilder, vllm_config, batch)
    assert type(meta) is AiterFlashAttentionMetadata
    assert (meta.num_decodes, meta.num_extends, meta.num_prefills) == (6, 0, 0)
    assert meta.num_decode_tokens == 6 * query_len and meta.num_extend_tokens == 0
    assert meta.decode_metadata is not None and meta.decode_metadata.max_query_len == query_len
    assert meta.prefill_metadata is None and meta.extend_metadata is None
    assert meta.seq_lens is batch.seq_lens and meta.block_table is batch.block_table_tensor
    stock, error = _stock_or_error(vllm_config, batch)
    if error is None:
        assert_same_metadata(meta, stock)


def test_the_real_bug(eagle_vllm_config):
    """Stock vLLM crashes on EAGLE's pure-decode batch exactly on the affected releases."""
    batch = samples.eagle_decode_batch(num_reqs=8, num_speculative_tokens=3)
    _, error = _stock_or_error(eagle_vllm_config, batch)
    if probe.probe_stock_split().affected:
        assert isinstance(error, AssertionError), "stock builder should crash on this release"
    else:
        assert error is None, f"stock builder crashed on an unaffected release: {error!r}"
    meta = _build(PluginAiterFlashAttentionMetadataBuilder, eagle_vllm_config, batch)
    assert meta.num_decodes == batch.num_reqs == 8
    assert meta.num_decode_tokens == 32 and meta.decode_metadata.max_query_len == 4


def test_cudagraph_capture_build_uses_plugin_split(eagle_vllm_config):
    batch = samples.eagle_decode_batch(num_reqs=4, num_speculative_tokens=3)
    meta = _builder(
        PluginAiterFlashAttentionMetadataBuilder, eagle_vllm_config
    ).build_for_cudagraph_capture(batch)
    assert meta.num_decodes == 4 and meta.decode_metadata.max_query_len == 4


def test_pure_decode_build_makes_no_host_copy(eagle_vllm_config):
    """Device tensors on `meta`: a .cpu()/.item()/.tolist() on any of them would raise."""
    batch = samples.make_batch([4, 4, 3], [40, 50, 60], device="meta", with_upper_bound=False)
    plugin = _builder(PluginAiterFlashAttentionMetadataBuilder, eagle_vllm_config, "meta")
    if "num_actual_kv_tokens" in AiterFlashAttentionMetadata.__dataclass_fields__:
        # vLLM 0.20-0.21: the metadata itself holds sum(seq_lens), a host value, so every build
        # copies seq_lens to the host, stock's too; the plugin can only avoid the crash there.
        with_bound = samples.make_batch(
            [4, 4, 3], [40, 50, 60], device="meta"
        )  # stock's own crash aside
        with pytest.raises(NotImplementedError):
            _builder(AiterFlashAttentionMetadataBuilder, eagle_vllm_config, "meta").build(
                0, with_bound
            )
        with pytest.raises(NotImplementedError):
            plugin.build(0, batch)
        return
    meta = plugin.build(0, batch)
    assert meta.num_decodes == 3 and meta.num_decode_tokens == 11
    mixed = samples.make_batch([1, 6], [40, 6], device="meta", with_upper_bound=False)
    with pytest.raises(NotImplementedError):  # control: the mixed path copies seq_lens to the host
        plugin.build(0, mixed)


SAME_AS_STOCK = [
    ("prefill-only", "vllm_config", [7, 12, 3], [7, 12, 3]),
    ("decode+prefill", "vllm_config", [1, 1, 1, 9, 5], [40, 17, 88, 9, 5]),
    ("extend-only", "vllm_config", [5, 9], [500, 3000]),
    ("decode+extend+prefill", "vllm_config", [1, 1, 6, 30, 9, 5], [40, 17, 600, 2100, 9, 5]),
    (
        "eagle decode+short prompt+prefill",
        "eagle_vllm_config",
        [4, 2, 9, 2, 16],
        [40, 17, 9, 2, 16],
    ),
    ("eagle all regions", "eagle_vllm_config", [4, 3, 2, 9, 6, 2, 5], [50, 60, 70, 900, 6, 2, 5]),
]


@pytest.mark.parametrize(
    "config_name, query_lens, seq_lens",
    [c[1:] for c in SAME_AS_STOCK],
    ids=[c[0] for c in SAME_AS_STOCK],
)
def test_same_metadata_as_stock(request, config_name, query_lens, seq_lens):
    vllm_config = request.getfixturevalue(config_name)
    batch = samples.make_batch(query_lens, seq_lens)
    plugin = _build(PluginAiterFlashAttentionMetadataBuilder, vllm_config, batch)
    stock = _build(AiterFlashAttentionMetadataBuilder, vllm_config, batch)
    assert_same_metadata(plugin, stock)


SLIDING_WINDOWS = (None, 64, 1000)


def _builder_pairs(tiny_model_dir, own_build=None):
    """(stock, plugin) builders by (threshold, sliding window), each over a real Attention layer
    (the plugin's constructed with ``own_build``; None: its default)."""
    pairs = {}
    for spec_tokens in (0, 1, 3, 7):
        for window in SLIDING_WINDOWS:
            config = samples.tiny_vllm_config(tiny_model_dir, num_speculative_tokens=spec_tokens)
            layer = samples.attention_layer(config, sliding_window=window)
            spec = samples.kv_cache_spec(config, sliding_window=window)
            stock = AiterFlashAttentionMetadataBuilder(spec, [layer], config, torch.device("cpu"))
            plugin = PluginAiterFlashAttentionMetadataBuilder(
                spec, [layer], config, torch.device("cpu"), own_build=own_build
            )
            assert (
                stock.reorder_batch_threshold == plugin.reorder_batch_threshold == 1 + spec_tokens
            )
            expected_window = None if window is None else (window - 1, 0)
            assert stock.aot_sliding_window == plugin.aot_sliding_window == expected_window
            pairs[1 + spec_tokens, window] = (stock, plugin)
    return pairs


@pytest.fixture(scope="module")
def builder_pairs(tiny_model_dir):
    return _builder_pairs(tiny_model_dir)


@pytest.fixture(scope="module")
def fallback_builder_pairs(tiny_model_dir):
    """The same pairs, the plugin's builders told to run vLLM's build() code."""
    return _builder_pairs(tiny_model_dir, own_build=False)


@randomised(400)
@given(
    spec=reordered_batches(thresholds=(1, 2, 4, 8), max_rows_per_region=20),
    window=st.sampled_from(SLIDING_WINDOWS),
)
def test_same_metadata_as_stock_on_random_reordered_batches(
    builder_pairs, spec: ForwardCase, window
):
    _assert_same_as_stock(builder_pairs, spec, window)


@randomised(150)
@given(spec=reordered_batches(thresholds=(1, 4)), window=st.sampled_from(SLIDING_WINDOWS))
def test_fallback_build_same_as_stock_on_random_reordered_batches(
    fallback_builder_pairs, spec, window
):
    _assert_same_as_stock(fallback_builder_pairs, spec, window)


@pytest.mark.parametrize("num_extends", [1, 3, 8, 64])
@pytest.mark.parametrize("context_len", [1, 4096, 12000])
def test_same_metadata_as_stock_with_many_context_chunks(builder_pairs, num_extends, context_len):
    """Extends whose context spans 0 to many workspace chunks (32768 tokens // num_extends each)."""
    rows = [
        Request(f"r{i}", max(0, context_len - 13 * i), 3 + i % 7, prompt_len=context_len + 11)
        for i in range(num_extends)
    ]
    spec = ForwardCase("many-chunks", tuple(rows), "given")
    for window in SLIDING_WINDOWS:
        _assert_same_as_stock(builder_pairs, spec, window)


INCONSISTENT_BUT_ACCEPTED = [
    # (threshold, query lens, seq lens, max_query_len): stock builds these without complaint
    (1, [0, 2], [5, 9], 1),  # max_query_len understates the longest query
    (4, [4, 6, 1], [40, 50, 9], 4),
    (1, [1, 0, 0], [9, 0, 0], 1),  # zero-length padded rows
    (1, [0, 0], [0, 0], 1),
    (4, [4, 0, 9, 0], [40, 0, 9, 0], 9),
    (1, [1, 7, 0], [9, 80, 0], 7),
]


@pytest.mark.parametrize(
    "threshold, query_lens, seq_lens, max_query_len", INCONSISTENT_BUT_ACCEPTED
)
def test_same_metadata_as_stock_on_inconsistent_but_accepted_input(
    builder_pairs, threshold, query_lens, seq_lens, max_query_len
):
    stock_builder, plugin_builder = builder_pairs[threshold, None]
    batch = samples.make_batch(query_lens, seq_lens, max_query_len=max_query_len)
    with unpinned_host_memory():
        stock = stock_builder.build(0, batch)
        plugin = plugin_builder.build(0, batch)
    assert_same_metadata(plugin, stock)


def _assert_same_as_stock(builder_pairs, spec: ForwardCase, window) -> None:
    stock_builder, plugin_builder = builder_pairs[spec.threshold, window]
    batch = laid_out(spec)[2]
    with unpinned_host_memory():
        stock = stock_builder.build(0, batch)
        plugin = plugin_builder.build(0, batch)
    assert_same_metadata(plugin, stock)


def test_own_build_path_is_verified_exactly_on_the_tested_releases():
    """The own build body runs on every release in the tested range (its build() fingerprint is
    listed) and on no other by default (releases.py and the fingerprints agree)."""
    verified = builder_module.verified_release() is not None
    assert verified is (vllm_releases.release() in releases.TESTED)
    assert builder_module.own_build_default() is verified


def test_the_installed_build_fingerprint_is_labelled_with_this_release():
    """The fingerprint table's label for the installed ``build()`` names a range of tested
    releases that holds the installed one (read off its wheel): the next release that ships the
    same ``build()`` cannot leave the label behind (compat runs this on every tested release)."""
    label = builder_module.verified_release()
    installed = vllm_releases.release()
    assert label is not None, f"vLLM {installed}'s build() is not in VERIFIED_BUILD_FINGERPRINTS"
    first, _, last = label.partition("-")
    assert {first, last or first} <= set(releases.TESTED), label
    assert releases.parse(first) <= releases.parse(installed) <= releases.parse(last or first), (
        f"vLLM {installed}'s build() is labelled {label}"
    )


def test_the_builder_body_is_the_argument_else_the_default(builder_pairs, fallback_builder_pairs):
    """Builders constructed with ``own_build=False`` run vLLM's build() code (through the
    plugin's split); the others run the own build where it is verified (or forced, by
    ``VLLM_ROCM_AITER_PLUGIN_OWN_BUILD=force``, as ``bash scripts/nox -s verify`` does), and not
    with ``VLLM_ROCM_AITER_PLUGIN_OWN_BUILD=0``."""
    assert not any(plugin.runs_own_build() for _, plugin in fallback_builder_pairs.values())
    default = builder_module.own_build_default()
    assert all(plugin.own_build is default for _, plugin in builder_pairs.values())
    (_, plugin), *_ = builder_pairs.values()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(envs.OWN_BUILD, "0")
        switched_off = type(plugin)(plugin.kv_cache_spec, plugin.layer_names, plugin.vllm_config,
                                    plugin.device)  # fmt: skip
    assert switched_off.own_build is False


def test_rebinding_refuses_code_that_does_not_call_the_split_as_a_global():
    def build_without_split(self):
        return None

    with pytest.raises(NotRebindable, match="does not read"):
        with_globals(build_without_split, {builder_module.SPLIT_GLOBAL_NAME: lambda *a: None})


def test_rebinding_refuses_a_build_that_calls_the_split_as_an_attribute():
    """A future build() calling ``utils.split_decodes_prefills_and_extends(...)`` names the split
    in ``co_names`` too; only a global lookup can be rebound."""
    namespace = {"utils": stock_utils, "split_decodes_prefills_and_extends": object()}
    exec(
        "def build(self, common_prefix_len, cam, fast_build=False):\n"
        "    return utils.split_decodes_prefills_and_extends(cam, self.reorder_batch_threshold)\n",
        namespace,
    )
    build = namespace["build"]
    assert "split_decodes_prefills_and_extends" in build.__code__.co_names
    with pytest.raises(NotRebindable, match="does not read"):
        with_globals(build, {builder_module.SPLIT_GLOBAL_NAME: lambda *a: None})


def test_a_layer_on_the_plugin_backend_runs_vllms_kernels_and_the_plugins_metadata(vllm_config):
    """vLLM's Attention layer created on the plugin's backend: vLLM's backend name and KV-cache
    layout, an impl that is vLLM's (vLLM's own forward and kernels), and the plugin's builder."""
    from vllm.v1.attention.backends.rocm_aiter_fa import AiterFlashAttentionImpl

    config = samples.tiny_vllm_config(vllm_config.model_config.model)
    layer_name = samples.attention_layer(config, backend=PluginAiterFlashAttentionBackend)
    layer = config.compilation_config.static_forward_context[layer_name]
    assert layer.attn_backend.get_name() == AiterFlashAttentionBackend.get_name()
    assert isinstance(layer.impl, AiterFlashAttentionImpl)
    assert type(layer.impl).forward is AiterFlashAttentionImpl.forward
    builder = layer.attn_backend.get_builder_cls()(
        samples.kv_cache_spec(config), [layer_name], config, torch.device("cpu")
    )
    assert isinstance(builder, PluginAiterFlashAttentionMetadataBuilder)


def test_fallback_build_is_stock_code_and_vllm_is_untouched():
    """The fallback build() is vLLM's own code; vLLM's module and class keep stock's split."""
    plugin_build = PluginAiterFlashAttentionMetadataBuilder.vllm_build
    assert plugin_build.__code__ is AiterFlashAttentionMetadataBuilder.build.__code__
    assert plugin_build.__globals__ is not rocm_aiter_fa.__dict__
    assert (
        rocm_aiter_fa.split_decodes_prefills_and_extends
        is stock_utils.split_decodes_prefills_and_extends
    )
    assert AiterFlashAttentionBackend.get_builder_cls() is AiterFlashAttentionMetadataBuilder
    assert AiterFlashAttentionBackend.get_impl_cls() is rocm_aiter_fa.AiterFlashAttentionImpl


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


@pytest.mark.parametrize("capture", [True, False], ids=["capture", "build"])
@pytest.mark.parametrize("threshold, window", [(1, None), (1, 64), (4, None), (4, 64)])
def test_decode_metadata_is_the_persistent_tensors_vllm_passes(
    builder_pairs, threshold, window, capture
):
    """A CUDA graph replays its kernels on the tensors it captured, so decode metadata must be
    vLLM's persistent input tensors, and the sliding-window decode tables (0.33) views of the
    builder's own buffers, written in place: for ``build_for_cudagraph_capture`` and for every
    ordinary build. Stock's builder is held to the same (the control)."""
    for builder in builder_pairs[threshold, window]:
        tables = []
        for seq_lens in ([40, 50, 60, 70], [90, 20, 33, 41]):
            batch = samples.make_batch([threshold] * 4, seq_lens)
            if capture:
                meta = builder.build_for_cudagraph_capture(batch)
            else:
                meta = builder.build(common_prefix_len=0, common_attn_metadata=batch)
            assert meta.num_decodes == 4, type(builder).__name__
            assert meta.seq_lens is batch.seq_lens
            assert meta.block_table is batch.block_table_tensor
            assert meta.query_start_loc is batch.query_start_loc
            assert meta.slot_mapping is batch.slot_mapping
            decode = meta.decode_metadata
            swa_table = getattr(decode, "swa_block_table", None)
            if swa_table is not None:
                assert _same_storage(swa_table, builder._swa_block_table)
                assert _same_storage(decode.swa_seq_lens, builder._swa_seq_lens)
                tables.append(swa_table)
        has_tables = hasattr(builder, "_build_swa_decode_tables") and window and threshold == 1
        assert len(tables) == (2 if has_tables else 0), (type(builder).__name__, len(tables))
        if tables:  # the second build wrote into the first one's buffer
            assert _same_storage(tables[0], tables[1])
