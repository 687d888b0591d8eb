"""The `legion` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import orjson

from legion import __version__, doctor


def _cmd_doctor(args: argparse.Namespace) -> int:
    checks = doctor.run_checks(Path(args.cwd))
    if args.json:
        sys.stdout.write(orjson.dumps(doctor.as_dicts(checks)).decode() + "\n")
    else:
        print(doctor.render(checks))
    return doctor.exit_code(checks)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="legion",
        description="Run trees of LLM agent sessions as an OTP-style supervision tree.",
    )
    parser.add_argument("--version", action="version", version=f"legion {__version__}")
    parser.add_argument("-C", "--cwd", default=".", help="project directory (default: the current one)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("doctor", help="check that this machine and project can host a run")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.set_defaults(func=_cmd_doctor)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
