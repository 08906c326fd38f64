"""Every environment variable the plugin reads: its name, its parser and what it does."""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

PLUGIN_NAME = "vllm_rocm_aiter_plugin"
"""Entry-point name in both vLLM groups; this is what ``VLLM_PLUGINS`` must list."""

SWITCH = "VLLM_ROCM_AITER_PLUGIN"
OWN_BUILD = "VLLM_ROCM_AITER_PLUGIN_OWN_BUILD"
ATTENTION_BACKEND = "VLLM_ATTENTION_BACKEND"
VLLM_PLUGINS = "VLLM_PLUGINS"
USE_AITER = "VLLM_ROCM_USE_AITER"
USE_AITER_MHA = "VLLM_ROCM_USE_AITER_MHA"
SHUFFLE_LAYOUT = "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT"
EXPOSURE_DIR = "VLLM_ROCM_AITER_PLUGIN_EXPOSURE_DIR"

_OFF = ("0", "false", "off", "no", "disable", "disabled")
_ON = ("1", "true", "on", "yes", "auto", "enable", "enabled", "")


class Switch(enum.Enum):
    """An on/off/force setting: on (the default) acts where the plugin's checks allow it;
    ``VLLM_ROCM_AITER_PLUGIN`` also takes observe (stock's output, the requests it serves without
    their context counted)."""

    ON = "on"
    OFF = "off"
    FORCE = "force"
    OBSERVE = "observe"


@dataclass(frozen=True)
class Reading:
    """What the plugin makes of one variable."""

    value: Any
    meaning: str
    problem: str | None = None


SHOWN_LIMIT = 200
"""The most characters of a variable's value that a log line or the doctor shows."""


def cut(text: str, limit: int = SHOWN_LIMIT) -> str:
    """``text``, cut to ``limit`` characters with a note of its length (a value may be any
    length; a log line should not)."""
    if len(text) <= limit:
        return text
    note = f"... ({len(text)} characters)"
    return text[: limit - len(note)] + note


def shown(raw: str) -> str:
    """``repr(raw)`` for a log line, cut to ``SHOWN_LIMIT`` characters."""
    return cut(repr(raw))


def _words(raw: str) -> str:
    return raw.strip().lower()


def _on_off_force(
    name: str, on: str, off: str, force: str, observe: str | None = None
) -> Callable[[str | None], Reading]:
    """A parser of an on/off/force switch: unset or an "on" word, ``0`` or an "off" word,
    ``force``, and ``observe`` where it has that meaning; anything else is a problem, read as
    on."""

    def parse(raw: str | None) -> Reading:
        if raw is None:
            return Reading(Switch.ON, f"unset: {on}")
        word = _words(raw)
        if word in _OFF:
            return Reading(Switch.OFF, off)
        if word == "force":
            return Reading(Switch.FORCE, force)
        if word == "observe" and observe is not None:
            return Reading(Switch.OBSERVE, observe)
        if word in _ON:
            return Reading(Switch.ON, on)
        also = ", observe to count without fixing" if observe is not None else ""
        return Reading(
            Switch.ON,
            "not understood: treated as unset",
            f"{name}={shown(raw)} is not understood; using on. Use 0 to switch it off, force to "
            f"override the plugin's checks{also}, or leave it unset.",
        )

    return parse


parse_switch = _on_off_force(
    SWITCH,
    "the plugin activates where the policy says",
    "the plugin is switched off: ROCM_AITER_FA stays stock",
    "the plugin overrides ROCM_AITER_FA whatever the policy says",
    "observe: ROCM_AITER_FA serves stock's output and the plugin only counts the requests stock "
    "serves without their cached context",
)
parse_own_build = _on_off_force(
    OWN_BUILD,
    "the plugin's own metadata build, on the vLLM releases it was checked against",
    "vLLM's own metadata build code runs, with the plugin's split (slower; stock's chunk sizes)",
    "the plugin's own metadata build, even on a vLLM release it was not checked against",
)


def parse_vllm_plugins(raw: str | None) -> Reading:
    """``VLLM_PLUGINS`` exactly as vLLM parses it (``vllm/envs.py``): unset = every plugin, else
    the comma-separated names as written (vLLM does not strip them: ``"a, b"`` allows ``" b"``)."""
    if raw is None:
        return Reading(None, "unset: vLLM loads every installed plugin")
    names = raw.split(",")
    if PLUGIN_NAME in names:
        return Reading(names, "vLLM loads the plugin")
    return Reading(
        names,
        "vLLM does not load the plugin",
        f"{VLLM_PLUGINS}={shown(raw)} excludes the plugin (vLLM splits it at commas without "
        f"stripping blanks): add {PLUGIN_NAME} to it, or unset {VLLM_PLUGINS}",
    )


def parse_use_aiter(raw: str | None) -> Reading:
    """``VLLM_ROCM_USE_AITER`` (vLLM's): with it on, ROCm's automatic backend selection may pick
    ROCM_AITER_FA. Read by the doctor only."""
    if raw is not None and _words(raw) in ("1", "true"):
        return Reading(
            True, "AITER on: ROCM_AITER_FA is a candidate of automatic selection (see below)"
        )
    return Reading(
        False,
        "AITER off: automatic selection never picks ROCM_AITER_FA, whatever the next line says; "
        "--attention-backend ROCM_AITER_FA still selects it",
    )


def parse_use_aiter_mha(raw: str | None) -> Reading:
    """``VLLM_ROCM_USE_AITER_MHA`` (vLLM's, default on): AITER's attention in auto-selection."""
    if raw is None or _words(raw) in ("1", "true"):
        return Reading(
            True,
            "on: with VLLM_ROCM_USE_AITER=1, ROCM_AITER_FA is a candidate of automatic selection, "
            "after ROCM_ATTN",
        )
    return Reading(False, "off: automatic selection never picks ROCM_AITER_FA")


def parse_shuffle_layout(raw: str | None) -> Reading:
    """``VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT`` (vLLM's, default off), read as vLLM reads it
    (``true`` or ``1``, any case)."""
    if raw is not None and raw.lower() in ("true", "1"):
        return Reading(
            True, "on: the shuffle KV-cache layout; the doctor's forward check runs in it"
        )
    return Reading(False, "off: the standard KV-cache layout")


def parse_exposure_dir(raw: str | None) -> Reading:
    """``VLLM_ROCM_AITER_PLUGIN_EXPOSURE_DIR``: where the counting processes write their exposure
    totals for ``/metrics`` (the plugin sets it in the first process that loads it)."""
    if raw is None:
        return Reading(None, "unset: the first process that loads the plugin sets it")
    return Reading(raw, f"the exposure totals go to {cut(raw)}")


def parse_attention_backend(raw: str | None) -> Reading:
    """``VLLM_ATTENTION_BACKEND``, without vLLM: the name it gives (upper case), or None for
    automatic selection. Which backend that name selects, and whether it can run here, needs vLLM:
    ``env_backend.resolve`` (the platform and the doctor read it through that)."""
    if raw is None:
        return Reading(None, "unset: automatic selection")
    name = raw.strip().upper()
    if name.lower() in ("", "auto"):
        return Reading(None, "auto: automatic selection")
    return Reading(
        name,
        f"names {cut(name)}: tried where vLLM selects automatically, when the plugin's "
        "platform is active (a ROCm GPU)",
    )


@dataclass(frozen=True)
class Variable:
    name: str
    owner: str  # "plugin", or "vLLM" (read by the plugin too)
    doc: str  # its values and what they do, for the README's table
    parse: Callable[[str | None], Reading]

    def read(self, environ: Mapping[str, str] | None = None) -> Reading:
        return self.parse((os.environ if environ is None else environ).get(self.name))


VARIABLES: tuple[Variable, ...] = (
    Variable(SWITCH, "plugin",
             "unset or `1`: on; `0`: stock vLLM everywhere; `force`: take ROCM_AITER_FA even "
             "where the activation policy below would not; `observe`: stock's output, and the "
             "requests stock serves without their context counted (log, /metrics)",
             parse_switch),
    Variable(OWN_BUILD, "plugin",
             "unset or `1`: the plugin's own metadata build on the vLLM releases it was checked "
             "against (context chunks sized by the rows that read context); `0`: vLLM's own "
             "build() code with the plugin's split (slower; chunks sized as vLLM sizes them); "
             "`force`: the own build on any release (release checks only)", parse_own_build),
    Variable(ATTENTION_BACKEND, "plugin",
             "a backend name, or `auto`. With a ROCm GPU, where neither --attention-backend nor "
             "vLLM's own choice for the model names one: picks among the backends vLLM's own "
             "automatic selection accepts for each layer (plus ROCM_AITER_FA where AITER is "
             "found and supported); otherwise a WARNING and vLLM's choice. It changes no config "
             "field (vLLM itself ignores the variable)", parse_attention_backend),
    Variable(VLLM_PLUGINS, "vLLM",
             "unset, or a comma list of the plugins vLLM loads: it must list "
             "vllm_rocm_aiter_plugin. vLLM does not strip blanks, so `a, vllm_rocm_aiter_plugin` "
             "excludes it", parse_vllm_plugins),
    Variable(USE_AITER, "vLLM",
             "`1` or `true`: AITER on ROCm. With it (and VLLM_ROCM_USE_AITER_MHA on), "
             "ROCM_AITER_FA is a candidate of vLLM's automatic selection, after ROCM_ATTN; "
             "--attention-backend ROCM_AITER_FA selects it either way", parse_use_aiter),
    Variable(USE_AITER_MHA, "vLLM",
             "unset, `1` or `true`: AITER attention in automatic selection; counts only with "
             "VLLM_ROCM_USE_AITER=1", parse_use_aiter_mha),
    Variable(EXPOSURE_DIR, "plugin",
             "set by the plugin in the first process that loads it (under `vllm serve`: the API "
             "server); the processes it starts write their exposure counts there, which "
             "`/metrics` reads. Leave it unset", parse_exposure_dir),
    Variable(SHUFFLE_LAYOUT, "vLLM",
             "`1` or `true`: AITER's shuffle KV-cache layout (gfx950 images). The doctor's "
             "forward check runs in the layout it names", parse_shuffle_layout),
)  # fmt: skip

BY_NAME = {variable.name: variable for variable in VARIABLES}


def read(name: str, environ: Mapping[str, str] | None = None) -> Reading:
    return BY_NAME[name].read(environ)
