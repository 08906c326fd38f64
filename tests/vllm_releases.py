"""Facts about vLLM releases that the tests check against, written independently of the plugin."""

from __future__ import annotations

import vllm

# Releases whose split asserts seq_lens_cpu_upper_bound before the pure-decode return
# (read off the PyPI wheels; fixed in 0.24.0 by PR #44936).
AFFECTED_RELEASES = frozenset(
    {"0.20.0", "0.20.1", "0.20.2", "0.21.0", "0.22.0", "0.22.1", "0.23.0"}
)


def release() -> str:
    """The installed vLLM's release, without local or dev suffixes."""
    return vllm.__version__.split("+")[0].split(".dev")[0]


TABLE = ("0.20.0", "0.33.0")  # the releases the facts above were read from, inclusive


def installed_is_affected() -> bool:
    """Whether the installed vLLM's stock split crashes on EAGLE's pure-decode batch: the table's
    fact inside the releases it covers; outside them (a newer image, a ROCm dev build) the stock
    split is run, since no list knows that release."""
    from packaging.version import Version

    low, high = (Version(v) for v in TABLE)
    if low <= Version(release()) <= high:
        return release() in AFFECTED_RELEASES
    return _stock_split_raises_on_eagle_decode()


def installed_drops_context_in_v2_order() -> bool:
    """Whether the installed vLLM's stock split puts a row with context in its prefill region on
    a model-runner V2 step (sorted by query length, threshold 1): a decode, a new 50-token
    prompt, then an 800-token chunk continuing 8192 cached tokens. Run, not looked up: no
    release is known to keep that row out."""
    import dataclasses

    import torch
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.attention.backends import utils as stock_utils

    offsets = torch.tensor([0, 1, 51, 851], dtype=torch.int32)
    seq_lens = torch.tensor([901, 50, 8992], dtype=torch.int32)
    fields = {f.name for f in dataclasses.fields(CommonAttentionMetadata)}
    upper_bound = {"seq_lens_cpu_upper_bound": seq_lens}  # a field from 0.20.0 on
    if "seq_lens_cpu_upper_bound" not in fields:
        upper_bound = {}
    batch = CommonAttentionMetadata(
        query_start_loc=offsets, query_start_loc_cpu=offsets, seq_lens=seq_lens, num_reqs=3,
        num_actual_tokens=851, max_query_len=800, max_seq_len=8992,
        block_table_tensor=torch.zeros((3, 600), dtype=torch.int32),
        slot_mapping=torch.zeros(851, dtype=torch.int64), **upper_bound,
    )  # fmt: skip
    num_decodes, num_extends, *_ = stock_utils.split_decodes_prefills_and_extends(batch, 1)
    return int(num_decodes) + int(num_extends) < 3


def _stock_split_raises_on_eagle_decode() -> bool:
    import torch
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.attention.backends import utils as stock_utils

    offsets = torch.arange(0, 17, 4, dtype=torch.int32)  # 4 requests x 4 tokens
    seq_lens = torch.tensor([104, 111, 118, 125], dtype=torch.int32)
    batch = CommonAttentionMetadata(
        query_start_loc=offsets, query_start_loc_cpu=offsets, seq_lens=seq_lens, num_reqs=4,
        num_actual_tokens=16, max_query_len=4, max_seq_len=125,
        block_table_tensor=torch.zeros((4, 8), dtype=torch.int32),
        slot_mapping=torch.zeros(16, dtype=torch.int64),
    )  # fmt: skip
    try:
        stock_utils.split_decodes_prefills_and_extends(batch, decode_threshold=4)
    except AssertionError:
        return True
    return False
