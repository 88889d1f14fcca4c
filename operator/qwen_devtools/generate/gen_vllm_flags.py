"""Prints the flag table of the pinned vLLM's OpenAI server parser, for offline extraArgs checks.

A script for the Python of the vLLM CPU venv (tools/vllm-env.sh), which has vllm but not this project:
standard library and vllm only. `make generate` runs it with `python -I` and writes its output, plus
the generated-file notice, to operator/qwen_operator/api/vllm_flags.json.
"""

from __future__ import annotations

import argparse
import json

import vllm
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser


def main() -> None:
    parser = make_arg_parser(FlexibleArgumentParser())
    flags: dict[str, bool] = {}
    for action in parser._actions:
        takes_value = (
            not isinstance(
                action,
                argparse._StoreTrueAction | argparse._StoreFalseAction | argparse.BooleanOptionalAction,
            )
            and action.nargs != 0
        )
        for option in action.option_strings:  # every spelling: --long, -q, and short forms like -tp, -ep
            flags[option] = takes_value
    print(json.dumps({"vllm": vllm.__version__, "flags": dict(sorted(flags.items()))}, indent=1))


if __name__ == "__main__":
    main()
