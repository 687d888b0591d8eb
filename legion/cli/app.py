"""The `legion` command line: the parser of every command, and `main` (errors every command shares become one
line on stderr and an exit status)."""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
from collections.abc import Callable, Sequence

from legion import __version__
from legion.cli.common import EXIT_LEDGER, EXIT_USAGE, LedgerUnreadable
from legion.cli.helptext import add_examples, top_parser
from legion.reports.fleet import FleetError
from legion.runs import RunNotFound


def command_names(parser: argparse.ArgumentParser) -> list[str]:
    """Every subcommand (doctor's tools section lists them from the parser itself: they cannot drift)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return sorted(action.choices)
    return []


def build_parser() -> argparse.ArgumentParser:
    parser = top_parser(
        prog="legion",
        description="Run trees of LLM agent sessions as an OTP-style supervision tree.",
    )
    parser.add_argument("--version", action="version", version=f"legion {__version__}")
    parser.add_argument("-C", "--cwd", default=".", help="project directory (default: the current one)")
    # the commands' parsers are plain ones: the top-level parser's class adds its own epilog
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=argparse.ArgumentParser)

    from legion.cli import (
        completion,
        demo,
        doctor,
        gc,
        mail,
        monitor,
        operate,
        project,
        rebuild,
        run,
        server,
        status,
    )

    # in the order `legion --help` lists them
    run.add_parser(sub)  # run
    operate.add_parsers(sub)  # launch, steer, abort, retire, stop, wait, collect
    mail.add_parser(sub)  # mail
    run.add_resume_parser(sub)  # resume
    status.add_report_parsers(sub)  # summary, timing
    project.add_parsers(sub)  # team, init
    rebuild.add_parser(sub)  # rebuild
    server.add_parsers(sub)  # keys
    gc.add_parser(sub)  # teams: `legion gc`
    demo.add_parser(sub)  # demo
    doctor.add_parser(sub)  # doctor
    project.add_agents_parser(sub)  # agents
    status.add_parsers(sub)  # status, tree, events
    monitor.add_parser(sub)  # monitor
    completion.add_parser(sub)  # completion
    _accept_cwd_after_the_command(parser)
    add_examples(parser)
    return parser


def _accept_cwd_after_the_command(parser: argparse.ArgumentParser) -> None:
    """`-C DIR` before or after the command (`legion -C DIR run …` and `legion run … -C DIR`). SUPPRESS: a
    command without it keeps the one given before the command (argparse copies only what was parsed)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                if not any("-C" in a.option_strings for a in sub._actions):
                    sub.add_argument("-C", "--cwd", default=argparse.SUPPRESS, metavar="DIR",
                                     help="project directory (default: the current one)")  # fmt: skip
                _accept_cwd_after_the_command(sub)


def _tolerant_output() -> None:
    """A terminal or pipe that cannot encode a character (PYTHONIOENCODING=ascii, a C locale) gets an escape
    for it instead of a crash in the middle of a summary."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and (getattr(stream, "encoding", "") or "").lower().replace("-", "") != "utf8":
            reconfigure(errors="backslashreplace")


def main(argv: Sequence[str] | None = None) -> int:
    _tolerant_output()
    from legion.procs import raise_nofile

    raise_nofile()  # every legion process (procs/rlimit.py); `legion run` hosts the root
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except (RunNotFound, FleetError) as exc:
        print(f"legion {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except LedgerUnreadable as exc:
        print(f"legion {args.command}: {exc}", file=sys.stderr)
        return EXIT_LEDGER
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`legion events | head`): stop quietly, and keep Python's
        # shutdown flush from raising again on the dead pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:
        from legion.ledger import LedgerError

        if not isinstance(exc, LedgerError | sqlite3.DatabaseError):
            raise
        # a newer ledger schema, a corrupt database (summary, timing, …): say what and where, no traceback
        print(f"legion {args.command}: {exc}", file=sys.stderr)
        return EXIT_LEDGER


if __name__ == "__main__":
    sys.exit(main())
