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
