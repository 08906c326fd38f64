"""Every environment variable the plugin reads: its name, what it does, and its parser.

Cheap to import, and the floor of the package: it imports no torch, no vLLM and nothing of the
plugin (``tests/test_layout.py``). Each parser turns the raw value (None when unset) into a
``Reading``: the value the plugin acts on, what that means in one line, and a problem line when
the raw value is not understood (the plugin then acts on the default). The doctor reports every
variable from here, and ``docs/architecture.md`` lists them.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

PLUGIN_NAME = "vllm_rocm_aiter_plugin"
"""Entry-point name in both vLLM groups; this is what ``VLLM_PLUGINS`` must list."""

SWITCH = "VLLM_ROCM_AITER_PLUGIN"
FAST_BUILD = "VLLM_ROCM_AITER_PLUGIN_FAST_BUILD"
ATTENTION_BACKEND = "VLLM_ATTENTION_BACKEND"
VLLM_PLUGINS = "VLLM_PLUGINS"
USE_AITER = "VLLM_ROCM_USE_AITER"
USE_AITER_MHA = "VLLM_ROCM_USE_AITER_MHA"
SHUFFLE_LAYOUT = "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT"
REQUIRE_HARDWARE = "VLLM_ROCM_AITER_PLUGIN_REQUIRE_HARDWARE"
E2E_TARGET = "VLLM_ROCM_AITER_E2E_TARGET"
E2E_DRAFT = "VLLM_ROCM_AITER_E2E_DRAFT"

_OFF = ("0", "false", "off", "no", "disable", "disabled")
_ON = ("1", "true", "on", "yes", "auto", "enable", "enabled", "")


class Switch(enum.Enum):
    AUTO = "auto"
    OFF = "off"
    FORCE = "force"


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


def parse_switch(raw: str | None) -> Reading:
    """``VLLM_ROCM_AITER_PLUGIN``: unset or on = the activation policy decides; ``0`` (or off,
    false, no, disable) = stock vLLM; ``force`` = override the policy."""
    if raw is None:
        return Reading(Switch.AUTO, "unset: the plugin activates where the policy says")
    word = _words(raw)
    if word in _OFF:
        return Reading(Switch.OFF, "the plugin is switched off: ROCM_AITER_FA stays stock")
    if word == "force":
        return Reading(Switch.FORCE, "the plugin overrides ROCM_AITER_FA whatever the policy says")
    if word in _ON:
        return Reading(Switch.AUTO, "on: the plugin activates where the policy says")
    return Reading(
        Switch.AUTO,
        "not understood: treated as unset",
        f"{SWITCH}={shown(raw)} is not understood; using auto. Use 0 to disable, force to override "
        "the policy, or leave it unset.",
    )


_FAST = "the plugin's faster metadata build"


def parse_fast_build(raw: str | None) -> Reading:
    """``VLLM_ROCM_AITER_PLUGIN_FAST_BUILD``: the plugin's own build body on verified vLLM
    releases (on by default); ``0`` runs vLLM's build() code with the plugin's split (stock's
    context chunk sizes); ``force`` runs the own body on an unverified release (release checks)."""
    if raw is None:
        return Reading("on", f"unset: {_FAST}, on the vLLM releases it was checked against")
    word = _words(raw)
    if word in _OFF:
        return Reading(
            "off", "vLLM's own metadata build code runs, with the plugin's split (slower)"
        )
    if word == "force":
        return Reading("force", f"{_FAST}, even on a vLLM release it was not checked against")
    if word in _ON:
        return Reading("on", f"{_FAST}, on the vLLM releases it was checked against")
    return Reading(
        "on",
        "not understood: treated as unset",
        f"{FAST_BUILD}={shown(raw)} is not understood; using on. Use 0 to run vLLM's own metadata build "
        "code, or leave it unset.",
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
        f"{VLLM_PLUGINS}={shown(raw)} excludes the plugin (vLLM splits it at commas without stripping "
        f"blanks): add {PLUGIN_NAME} to it, or unset {VLLM_PLUGINS}",
    )


def parse_use_aiter(raw: str | None) -> Reading:
    """``VLLM_ROCM_USE_AITER`` (vLLM's): with it on, ROCm's automatic backend selection may pick
    ROCM_AITER_FA. Read by the doctor only."""
    on = raw is not None and _words(raw) in ("1", "true")
    if on:
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
    on = raw is None or _words(raw) in ("1", "true")
    if on:
        return Reading(
            True,
            "on: with VLLM_ROCM_USE_AITER=1, ROCM_AITER_FA is a candidate of automatic selection, "
            "after ROCM_ATTN",
        )
    return Reading(False, "off: automatic selection never picks ROCM_AITER_FA")


def parse_shuffle_layout(raw: str | None) -> Reading:
    """``VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT`` (vLLM's, default off): AITER's shuffle KV-cache
    layout, read as vLLM reads it (``true`` or ``1``, any case)."""
    if raw is not None and raw.lower() in ("true", "1"):
        return Reading(
            True, "on: the shuffle KV-cache layout; the doctor's forward check runs in it"
        )
    return Reading(False, "off: the standard KV-cache layout")


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


def parse_flag(raw: str | None) -> Reading:
    """A test-suite flag: set and not 0/false/off means on."""
    on = raw is not None and _words(raw) not in _OFF
    return Reading(on, "on" if on else "off")


def parse_path(raw: str | None) -> Reading:
    return Reading(raw, raw or "unset")


def _words_accepted(words: tuple[str, ...]) -> str:
    """``"`0` (or `false`, `off`, ...)"``: the first word, then the others it stands for."""
    first, *others = (w for w in words if w)
    return f"`{first}` (or {', '.join(f'`{w}`' for w in others)})"


ON_OFF_FORCE = f"unset or {_words_accepted(_ON)}; {_words_accepted(_OFF)}; `force`"


@dataclass(frozen=True)
class Variable:
    name: str
    owner: str  # "plugin", "vLLM" (read by the plugin too) or "tests"
    values: str  # what it accepts, for the generated tables (README, docs/architecture.md)
    doc: str
    parse: Callable[[str | None], Reading]

    def read(self, environ: Mapping[str, str] | None = None) -> Reading:
        return self.parse((os.environ if environ is None else environ).get(self.name))


VARIABLES: tuple[Variable, ...] = (
    Variable(SWITCH, "plugin", ON_OFF_FORCE,
             "`0`: stock vLLM everywhere. `force`: take ROCM_AITER_FA even where the activation "
             "policy below would not", parse_switch),
    Variable(FAST_BUILD, "plugin", ON_OFF_FORCE,
             "`0`: vLLM's own metadata build code with the plugin's split (slower; context chunks "
             "sized as vLLM sizes them). `force`: the plugin's faster build even on a vLLM release "
             "it was not checked against (release checks only)", parse_fast_build),
    Variable(ATTENTION_BACKEND, "plugin", "a backend name, `auto`",
             "with a ROCm GPU, where neither --attention-backend nor vLLM's own choice for the "
             "model names one: picks among the backends vLLM's own automatic selection accepts for "
             "each layer (plus ROCM_AITER_FA where AITER is found and supported); otherwise a "
             "WARNING and vLLM's choice. It changes no config field (vLLM itself ignores the "
             "variable)", parse_attention_backend),
    Variable(VLLM_PLUGINS, "vLLM", "unset, or a comma list",
             "which plugins vLLM loads: must list vllm_rocm_aiter_plugin if set. vLLM does not "
             "strip blanks, so `a, vllm_rocm_aiter_plugin` excludes it", parse_vllm_plugins),
    Variable(USE_AITER, "vLLM", "`1`, `true`: on; unset or anything else: off",
             "AITER on ROCm. With it (and VLLM_ROCM_USE_AITER_MHA on), ROCM_AITER_FA is a "
             "candidate of vLLM's automatic selection, after ROCM_ATTN; --attention-backend "
             "ROCM_AITER_FA selects it either way",
             parse_use_aiter),
    Variable(USE_AITER_MHA, "vLLM", "unset, `1`, `true`: on; anything else: off",
             "AITER attention in automatic selection; counts only with VLLM_ROCM_USE_AITER=1",
             parse_use_aiter_mha),
    Variable(SHUFFLE_LAYOUT, "vLLM", "`1`, `true`: on; unset or anything else: off",
             "AITER's shuffle KV-cache layout (gfx950 images). The doctor's forward check runs "
             "in the layout it names", parse_shuffle_layout),
    Variable(REQUIRE_HARDWARE, "tests", "unset, `1`", "hardware skips fail (a GPU runner)",
             parse_flag),
    Variable(E2E_TARGET, "tests", "a directory",
             "local target model directory for the MI300 EAGLE run", parse_path),
    Variable(E2E_DRAFT, "tests", "a directory", "local EAGLE draft model directory for that run",
             parse_path),
)  # fmt: skip

BY_NAME = {variable.name: variable for variable in VARIABLES}


def read(name: str, environ: Mapping[str, str] | None = None) -> Reading:
    return BY_NAME[name].read(environ)
