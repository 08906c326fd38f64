"""Field-by-field equality of attention metadata: every tensor's dtype, device, shape and values."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch


def assert_same_metadata(actual: Any, expected: Any, path: str = "metadata") -> None:
    """Assert ``actual`` equals ``expected`` recursively."""
    if isinstance(expected, torch.Tensor) and expected.dim() == 0 and isinstance(actual, int):
        assert actual == int(expected), f"{path}: {actual} != {int(expected)}"
        return
    assert type(actual) is type(expected), (
        f"{path}: {type(actual).__name__} != {type(expected).__name__}"
    )
    if isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.device == expected.device, (
            f"{path}: device {actual.device} != {expected.device}"
        )
        assert actual.shape == expected.shape, (
            f"{path}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
        )
        if expected.device.type != "meta" and not path.endswith("workspace"):
            # Workspaces are torch.empty scratch buffers: their contents are undefined.
            assert torch.equal(actual, expected), f"{path}: values differ"
    elif dataclasses.is_dataclass(expected):
        for field in dataclasses.fields(expected):
            assert_same_metadata(
                getattr(actual, field.name), getattr(expected, field.name), f"{path}.{field.name}"
            )
    elif isinstance(expected, dict):
        assert actual.keys() == expected.keys(), f"{path}: keys differ"
        for key in expected:
            assert_same_metadata(actual[key], expected[key], f"{path}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same_metadata(a, e, f"{path}[{i}]")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"
