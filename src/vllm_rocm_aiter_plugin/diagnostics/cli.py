"""``vllm-rocm-aiter-plugin`` / ``python -m vllm_rocm_aiter_plugin``: demo (default), doctor, ab."""

from __future__ import annotations

import argparse
import errno
import importlib.util
import io
import os
import sys

_STDOUT_ERRNOS = {errno.EPIPE, errno.ENOSPC, errno.EBADF, errno.EIO}

EXIT_CODES = """exit codes:
  0  fix active, or not needed on this vLLM
  1  this vLLM is affected and the fix is not active (or not working), or a PROBLEM line
     names a misconfiguration to fix
  2  a check could not run, or the report could not be written"""

AB_EXIT_CODES = """exit codes:
  0  the plugin parts from the reference on no request stock does not part on
  1  it does on some: attach --json to an issue
  2  the reference or the plugin could not serve"""

DESCRIPTION = (
    "Show and check the plugin's fixes of vLLM's ROCM_AITER_FA on the installed vLLM, for its "
    "three bugs: 1. the EAGLE crash of model-runner V2's pure-decode batches; 2. the cached "
    "context that model-runner V2's batch order makes it ignore; 3. NaN from empty context "
    "chunks."
)


def _parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    parser = argparse.ArgumentParser(
        prog="vllm-rocm-aiter-plugin",
        description=DESCRIPTION,
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    sub.add_parser(
        "demo", help="show the three bugs and the fix on the installed vLLM (the default)"
    )
    doctor = sub.add_parser(
        "doctor",
        help="diagnose this installation: is vLLM affected, is the fix active? "
        "(--json: one JSON document on stdout, for CI)",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    doctor.add_argument("--json", action="store_true", help="one JSON document on stdout, for CI")
    doctor.add_argument(
        "--all-cases", action="store_true",
        help="after its own steps, run every case of the forward catalogue the test tiers run "
        "(each configuration: fp8, shuffle, sinks, head and block sizes, EAGLE; minutes on a CPU, "
        "seconds on a GPU): on an MI300, AITER's own kernels judged on each",
    )  # fmt: skip
    serving = doctor.add_argument_group(
        "your serving configuration",
        "run the forward check in it, spelled as `vllm serve` spells it (default: the check's "
        "own: auto cache, block size 16, head size 64); the table and the JSON name it",
    )
    serving.add_argument(
        "--kv-cache-dtype", choices=("auto", "fp8", "fp8_e4m3"),
        help="fp8: the GPU's own fp8 format (on CPU MI300's e4m3fnuz), scales that are not 1 "
        "(fp8_e5m2 is not offered: vLLM's ROCm cache write refuses it)",
    )  # fmt: skip
    serving.add_argument("--block-size", type=int, choices=(16, 32))
    serving.add_argument("--head-size", type=int, choices=(64, 128, 256),
                         help="your model's attention head size")  # fmt: skip
    ab = sub.add_parser(
        "ab",
        help="your prompts through stock ROCM_AITER_FA, the plugin and a reference backend, "
        "each in its own engine process with your engine arguments; where each parts from the "
        "reference",
        usage="vllm-rocm-aiter-plugin ab MODEL --prompts FILE [options] [vllm serve's engine "
        "arguments: --tensor-parallel-size, --kv-cache-dtype, --speculative-config, ...]",
        epilog=AB_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    ab.add_argument("model", help="as vllm serve takes it")
    ab.add_argument("--prompts", required=True,
                    help="JSON Lines: a text, a list of token ids, or an object with prompt or "
                    "prompt_token_ids per line")  # fmt: skip
    ab.add_argument("--max-tokens", type=int, default=64, help="greedy tokens per request")
    ab.add_argument("--reference", default="TRITON_ATTN",
                    help="the backend judged right (default TRITON_ATTN: no three-way split)")  # fmt: skip
    ab.add_argument("--json", action="store_true", help="one JSON document on stdout")
    return parser, doctor


def _missing_runtime() -> str | None:
    """What this Python lacks to run the commands (vLLM, torch), or None."""
    missing = [name for name in ("torch", "vllm") if importlib.util.find_spec(name) is None]
    if not missing:
        return None
    return (
        f"{' and '.join(missing)} not installed in this Python ({sys.executable}); install the "
        "plugin into the Python environment that runs vLLM"
    )


def main(argv: list[str] | None = None) -> int:
    parser, doctor_parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and args.command != "ab":  # ab hands the rest to vLLM's engine arguments
        (doctor_parser if args.command == "doctor" else parser).error(
            f"unrecognized arguments: {' '.join(unknown)}"
        )
    if sys.stdout is None:  # started with stdout closed: nowhere to write the report
        print("vllm-rocm-aiter-plugin: stdout is closed; nothing can be reported", file=sys.stderr)
        return 2
    missing = _missing_runtime()
    if missing:
        print(f"vllm-rocm-aiter-plugin: {missing}", file=sys.stderr)
        return 2
    os.environ["VLLM_LOGGING_STREAM"] = "ext://sys.stderr"  # before vLLM configures its logging
    from vllm_rocm_aiter_plugin.diagnostics import vllm_log

    vllm_log.import_vllm_quietly()
    try:
        if args.command == "doctor":
            from vllm_rocm_aiter_plugin import envs
            from vllm_rocm_aiter_plugin.diagnostics import doctor_output
            from vllm_rocm_aiter_plugin.diagnostics.forward.cases import ServingConfiguration

            shuffle = envs.read(envs.SHUFFLE_LAYOUT).value
            configuration = ServingConfiguration(
                args.kv_cache_dtype, args.block_size, args.head_size, "SHUFFLE" if shuffle else None
            )
            code = doctor_output.run(
                as_json=args.json, configuration=configuration, all_cases=args.all_cases
            )
        elif args.command == "ab":
            from vllm_rocm_aiter_plugin.diagnostics import ab

            engine_args = ["--model", args.model, *unknown]
            code = ab.run(engine_args, args.prompts, args.max_tokens, args.reference, args.json)
        else:
            from vllm_rocm_aiter_plugin.diagnostics import demo

            code = demo.run()
        sys.stdout.flush()
    except OSError as exc:  # closed pipe, full disk: the report did not reach its reader
        if exc.errno not in _STDOUT_ERRNOS:
            raise
        _silence_stdout()
        print(f"vllm-rocm-aiter-plugin: cannot write the report to stdout: {exc}", file=sys.stderr)
        return 2
    return code


def _silence_stdout() -> None:
    """Point fd 1 at /dev/null so that the interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        pass


if __name__ == "__main__":
    sys.exit(main())
