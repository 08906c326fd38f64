"""The commands' end-to-end runs, as an operator starts them: ``python -m vllm_rocm_aiter_plugin``
from a directory outside the checkout, in a fresh process. Each distinct run happens once per
test process and is shared by every test whose assertions it can answer (``tests/commands``;
the workflow test checks that ``rocm.yml`` runs these very commands)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from tests.helpers.subprocess_util import scrubbed_env

DEMO = ("python3", "-m", "vllm_rocm_aiter_plugin")
DOCTOR_JSON = (*DEMO, "doctor", "--json")
"""The commands as ``rocm.yml`` spells them; here ``python3`` is this environment's Python."""
AITER_ON = (("VLLM_ROCM_USE_AITER", "1"),)
DISABLED = (
    ("VLLM_ROCM_AITER_PLUGIN", "0"),
    ("VLLM_PLUGINS", "foo, vllm_rocm_aiter_plugin"),
    ("VLLM_ATTENTION_BACKEND", "bogus"),
)
"""Three ways an operator's environment turns the fix off or asks for what cannot be: the kill
switch, a ``VLLM_PLUGINS`` entry with a blank (vLLM does not strip it), an unknown backend name."""
SERVING = ("--kv-cache-dtype", "fp8", "--block-size", "32", "--head-size", "128")


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str
    left_behind: tuple[str, ...]  # what the run left in its temporary directory

    def json(self) -> dict[str, Any]:
        """stdout as the one JSON document it must be (nothing else is printed there)."""
        return json.loads(self.stdout)


@functools.cache
def run(command: tuple[str, ...], env: tuple[tuple[str, str], ...] = ()) -> Ran:
    """``command`` (one of the above) with ``env`` over a scrubbed environment, started outside
    the checkout; once per test process."""
    with tempfile.TemporaryDirectory(prefix="operator-") as outside:
        proc = subprocess.run(
            [sys.executable, *command[1:]], cwd=outside,
            env=scrubbed_env({**dict(env), "TMPDIR": outside}), capture_output=True, text=True,
            timeout=1200, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        left = tuple(sorted(os.listdir(outside)))
    return Ran(proc.returncode, proc.stdout, proc.stderr, left)
