"""vLLM entry points of vllm-rocm-aiter-plugin (what each does: :mod:`.registration`)."""

from vllm_rocm_aiter_plugin._version import __version__
from vllm_rocm_aiter_plugin.registration import platform_plugin, register

__all__ = ["__version__", "platform_plugin", "register"]
