"""Facts about the installed vLLM that the tests check against: inside the tested range from the
one source (``src/vllm_rocm_aiter_plugin/releases.py``, read off the wheels), elsewhere by running
vLLM's own code, since no list knows that release."""

from __future__ import annotations

import vllm

from vllm_rocm_aiter_plugin import releases


def release() -> str:
    """The installed vLLM's release, without local or dev suffixes."""
    return vllm.__version__.split("+")[0].split(".dev")[0]


TABLE = (releases.OLDEST, releases.NEWEST)  # the releases the facts were read from, inclusive


def installed_is_affected() -> bool:
    """Whether the installed vLLM's stock split crashes on EAGLE's pure-decode batch: the table's
    fact inside the releases it covers; outside them (a newer image, a ROCm dev build) the stock
    split is run, since no list knows that release."""
    from packaging.version import Version

    low, high = (Version(v) for v in TABLE)
    if low <= Version(release()) <= high:
        return release() in releases.EAGLE_CRASH
    return _stock_split_raises_on_eagle_decode()


def installed_drops_context_in_v2_order() -> bool:
    """Whether the installed vLLM's stock split puts a row with context in its prefill region on
    a model-runner V2 step (sorted by query length, threshold 1): a decode, a new 50-token
    prompt, then an 800-token chunk continuing 8192 cached tokens. Run, not looked up: no
    release is known to keep that row out."""
    num_decodes, num_extends, *_ = _stock_split(
        [1, 50, 800], [901, 50, 8992], threshold=1, with_upper_bound=True
    )
    return int(num_decodes) + int(num_extends) < 3


def installed_merge_makes_nan_of_empty_states() -> bool | None:
    """Whether the installed vLLM's merge turns two empty context chunks into NaN: the table's
    fact (read off the wheels, confirmed by the forward tier) inside the releases it covers; None
    outside them, where only the forward tier's child, which runs the merge, can tell."""
    from packaging.version import Version

    low, high = (Version(v) for v in TABLE)
    if low <= Version(release()) <= high:
        return release() in releases.MERGE_NAN_OF_EMPTY_STATES
    return None


def compile_identity(config: object) -> object:
    """What vLLM's compile cache keys a config by: ``compute_hash()`` up to 0.33.0,
    ``compile_factors()`` from 0.34.0 (which removed ``compute_hash``)."""
    for name in ("compute_hash", "compile_factors"):
        method = getattr(config, name, None)
        if method is not None:
            return repr(method())
    raise AttributeError(f"{type(config).__name__} has neither compute_hash nor compile_factors")


def installed_counts_sink_once() -> bool:
    """Whether the installed vLLM's own ``extend_forward`` passes a layer's sink to one AITER call
    only (0.34.0), found by running that code."""
    from vllm_rocm_aiter_plugin.diagnostics.forward.runner import vllm_counts_sink_once_here

    return vllm_counts_sink_once_here() is True


def _stock_split_raises_on_eagle_decode() -> bool:
    """EAGLE's pure-decode metadata as model-runner V2 builds it: no upper bound."""
    try:
        _stock_split([4] * 4, [104, 111, 118, 125], threshold=4, with_upper_bound=False)
    except AssertionError:
        return True
    return False


def _stock_split(
    query_lens: list[int], seq_lens: list[int], threshold: int, with_upper_bound: bool
) -> tuple:
    """The installed vLLM's own split on a real ``CommonAttentionMetadata`` (host tensors; the
    upper bound set only where this vLLM has that field)."""
    from vllm.v1.attention.backends import utils as stock_utils

    from vllm_rocm_aiter_plugin.diagnostics.samples import make_batch

    batch = make_batch(query_lens, seq_lens, with_upper_bound=with_upper_bound)
    return stock_utils.split_decodes_prefills_and_extends(batch, decode_threshold=threshold)
