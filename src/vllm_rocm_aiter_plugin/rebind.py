"""Run a vLLM function with some of its global names resolved differently, without touching vLLM."""

from __future__ import annotations

import dis
import types
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class NotRebindable(RuntimeError):
    """The function does not look the name up as a module global (a vLLM change)."""


def loads_global(code: types.CodeType, name: str) -> bool:
    """Whether ``code`` reads ``name`` as a global (``LOAD_GLOBAL``), as opposed to an attribute
    of the same name (``module.name``), which ``co_names`` would list too."""
    return any(
        instruction.opname == "LOAD_GLOBAL" and instruction.argval == name
        for instruction in dis.get_instructions(code)
    )


def with_globals(function: F, replacements: Mapping[str, Any]) -> F:
    """A copy of ``function`` whose globals named in ``replacements`` resolve to the given objects."""
    code = function.__code__
    missing = [name for name in replacements if not loads_global(code, name)]
    if missing:
        raise NotRebindable(
            f"{function.__module__}.{function.__qualname__} does not read "
            f"{', '.join(missing)} as a module global"
        )
    namespace = {**function.__globals__, **replacements}
    rebound = types.FunctionType(
        code, namespace, function.__name__, function.__defaults__, function.__closure__
    )
    rebound.__kwdefaults__ = function.__kwdefaults__
    rebound.__qualname__ = function.__qualname__
    rebound.__doc__ = function.__doc__
    rebound.__annotations__ = dict(function.__annotations__)
    rebound.__wrapped__ = function  # type: ignore[attr-defined]
    return rebound  # type: ignore[return-value]
