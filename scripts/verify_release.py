"""Verify the plugin's own build path on a vLLM release and print the fingerprint line to add.

Usage, in an environment with that vLLM (``bash scripts/nox -s verify -- 0.34.0`` builds one):
``python scripts/verify_release.py 0.34.0``. Exit 0: verified; 1: a test failed; 2: wrong vLLM.
"""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIFFERENTIAL_TESTS = [
    "tests/unit/test_builder.py",
    "tests/unit/test_model_runner_v2.py",
    "tests/unit/test_split.py",
]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    wanted = argv[0]
    import vllm

    from vllm_rocm_aiter_plugin import builder, envs

    if vllm.__version__.split("+")[0] != wanted:
        print(
            f"verify_release: vLLM {vllm.__version__} is installed, not {wanted}", file=sys.stderr
        )
        return 2
    fingerprint = builder.build_fingerprint()
    known = builder.VERIFIED_BUILD_FINGERPRINTS.get(fingerprint)
    print(f"vLLM {wanted}: build() fingerprint {fingerprint} "
          f"({'known: ' + known if known else 'not yet verified'})")  # fmt: skip
    env = {**os.environ, envs.OWN_BUILD: "force"}
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *DIFFERENTIAL_TESTS],
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if tests.returncode != 0:
        print(f"verify_release: the differential tests FAILED on vLLM {wanted}: the own build "
              "path does not match this release's build(); do not add its fingerprint")  # fmt: skip
        return 1
    if known:
        print(f"verify_release: vLLM {wanted} passes; its fingerprint is already listed")
    else:
        print("verify_release: passed. Add this line to VERIFIED_BUILD_FINGERPRINTS:")
        print(f'    "{fingerprint}": "{wanted}",')
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
