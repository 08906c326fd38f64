"""``vllm-rocm-aiter-plugin`` / ``python -m vllm_rocm_aiter_plugin``: demo (default) and doctor."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="vllm-rocm-aiter-plugin",
        description="Check and demonstrate the ROCM_AITER_FA pure-decode split fix.",
    )
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("demo", help="show the bug and the fix on the installed vLLM (default)")
    doctor_parser = sub.add_parser("doctor", help="diagnose: is vLLM affected, is the fix active?")
    doctor_parser.add_argument("--json", action="store_true", help="one JSON object, for CI")
    args = parser.parse_args(argv)
    if args.command in (None, "demo"):
        from vllm_rocm_aiter_plugin.diagnostics import demo

        return demo.run()
    if args.command == "doctor":
        from vllm_rocm_aiter_plugin.diagnostics import doctor

        return doctor.run(as_json=args.json)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
