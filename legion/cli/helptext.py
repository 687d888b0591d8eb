"""What `--help` shows beyond the arguments: each command's examples, and the exit statuses and environment
variables of `legion --help`."""

from __future__ import annotations

import argparse
import textwrap
from typing import Any, Final

from legion.cli.common import EXIT_USAGE
from legion.run_errors import EXIT_FAILED, EXIT_INFRA, EXIT_OK, EXIT_PAUSED

_RUN = "20261202-140312-a1b2c3"  # a run id as `legion run` makes them (time and a random suffix)

# Each command's examples: one command line per line (a test parses every one with the real parser), and
# an optional `# comment` saying what it does.
EXAMPLES: Final[dict[str, str]] = {
    "run": f"""\
legion run "fix the failing test in tests/test_api.py"
legion run @TASK.md --model anthropic/claude-sonnet-4-5 --max-cost 2 --timeout 3600
echo "say hello" | legion run - --model scripted/echo     # no key: a scripted model
legion run --json "summarise CHANGES.md" > events.jsonl     # one JSON event per line (docs/events.md)
legion run --output-format json "fix the lint" | jq .total_cost_usd   # one `result` object at the end
legion run --team duo --agent centurion "add a --verbose flag"
legion run --detach "refactor the parser"                    # prints the run id; `legion status` follows it
legion run --run-id {_RUN} --progress-every 10 "update the docs"
""",
    "resume": f"""\
legion resume {_RUN}                 # the root session again; paused members stay paused
legion resume {_RUN} --all           # every paused node
legion resume {_RUN} coder reviewer  # the root and these two
legion resume {_RUN} --detach        # checked here, then continued as a daemon
""",
    "launch": f"""\
legion launch {_RUN} --agent worker --task "write tests for parser.py"
legion launch {_RUN} --agent reviewer --task @REVIEW.md --name rev2 --parent coder --model openai/gpt-4.1
""",
    "steer": f"""\
legion steer {_RUN} coder "stop refactoring; only fix the bug"
""",
    "abort": f"""\
legion abort {_RUN} coder   # interrupts its current turn; it stays alive
""",
    "retire": f"""\
legion retire {_RUN} coder
legion retire {_RUN} coder --force
""",
    "stop": f"""\
legion stop {_RUN} coder    # the node and its subtree
legion stop {_RUN} --all    # pause the whole run (exit 130); `legion resume` continues it
""",
    "wait": f"""\
legion wait {_RUN}                       # until the root session settles
legion wait {_RUN} coder reviewer --timeout 600
""",
    "collect": f"""\
legion collect {_RUN} coder
legion collect {_RUN} coder --json
""",
    "mail": f"""\
legion mail {_RUN}            # every mail of the run
legion mail {_RUN} coder      # one node's inbox and outbox
legion mail send {_RUN} coder --subject "scope" --body "leave the CLI alone" --kind notice
legion mail send {_RUN} root --subject "question" --body @Q.md --urgency action-needed
""",
    "summary": f"""\
legion summary                    # the newest run
legion summary {_RUN} coder --json
legion summary --ledger postgresql://legion@db:5432/legion --project acme --json   # every run: the fleet's totals
""",
    "timing": f"""\
legion timing
legion timing {_RUN} --json
""",
    "team": """\
legion team            # the rosters; * marks the active one
legion team duo --json
LEGION_TEAM=duo legion run "add a --verbose flag"   # pick a team for one run
""",
    "init": """\
legion init
legion init -C ~/src/myproject
""",
    "rebuild": f"""\
legion rebuild {_RUN}
legion rebuild .legion/runs/{_RUN} --json
""",
    "keys": """\
legion keys server       # ~/.config/legion/keys/server.key and server.key_secret
legion keys alice --dir ./keys
""",
    "gc": """\
legion gc --dry-run
legion gc --branches
""",
    "demo": """\
legion demo
legion demo --keep --json
""",
    "doctor": """\
legion doctor             # this machine
legion doctor models      # providers, keys (never shown) and each card's model
legion doctor next        # every fix, in order
legion doctor summary --json
""",
    "agents": """\
legion agents
legion agents project --all
legion agents --json
""",
    "status": f"""\
legion status             # the newest run
legion status {_RUN} --json
legion status --ledger postgresql://legion@db:5432/legion          # every run in that database (the fleet)
legion status --ledger --host ci-7 --state running,lost           # --ledger alone: LEGION_LEDGER_URL
""",
    "tree": f"""\
legion tree
legion tree {_RUN}
""",
    "events": f"""\
legion events
legion events {_RUN} --after 120 --limit 50 --json
legion events --follow --idle 60
legion events --ledger postgresql://legion@db:5432/legion --follow --json   # every run's, woken by NOTIFY
""",
    "monitor": f"""\
legion monitor {_RUN}
legion monitor {_RUN} --follow
legion monitor {_RUN} --json --count 100
legion monitor tcp://server:7710 --key ~/.config/legion/keys/alice.key_secret --server-key server.key
legion monitor --ledger postgresql://legion@db:5432/legion                  # the runs with a tcp monitor
legion monitor --ledger --run nightly-42 --key ~/.config/legion/keys/alice.key_secret
""",
    "completion": """\
legion completion bash > ~/.local/share/bash-completion/completions/legion
legion completion zsh > ~/.zfunc/_legion    # with fpath+=(~/.zfunc) before compinit in ~/.zshrc
""",
}

TOP_EXAMPLES: Final = """\
legion init
legion run "add a --verbose flag to the CLI"
legion status
legion run --help      # each command's options and examples
"""

# (status, what it means), every status a command exits with (README "Exit statuses" has them per command)
EXIT_STATUSES: Final[tuple[tuple[int, str], ...]] = (
    (EXIT_OK, "success; run/resume/demo: the root settled successfully"),
    (EXIT_FAILED, "run/resume/demo: the root failed, was aborted or timed out; operator verbs: refused (the "
                  "reply says why); doctor: a check failed; status: the run's root died mid-run"),
    (EXIT_USAGE, "bad usage or configuration (an unknown run, a bad flag): nothing was started"),
    (EXIT_INFRA, "run/resume: infrastructure failure (restart intensity exceeded); any command: the run's "
                 "legion.db cannot be read"),
    (EXIT_PAUSED, "interrupted; run/resume: paused by SIGINT/SIGTERM or `legion stop --all` (`legion resume` "
                  "continues it)"),
)

# (variable, what it does) — the ones a user sets; then the ones legion sets for a session's tools
ENVIRONMENT: Final[tuple[tuple[str, str], ...]] = (
    ("ANTHROPIC_API_KEY", "the anthropic provider's key; with no model configured, a set key picks "
                          "anthropic/claude-sonnet-4-5"),
    ("OPENAI_API_KEY", "the openai provider's key; with no model configured and no anthropic key, a set key "
                       "picks openai/gpt-4.1"),
    ("ANTHROPIC_BASE_URL, OPENAI_BASE_URL", "another endpoint for the built-in provider (a proxy)"),
    ("LEGION_TEAM", "the active team (overrides the `team` setting; `run --team` overrides it)"),
    ("LEGION_LOG_LEVEL", "the level of log lines on stderr: WARNING (default), INFO, DEBUG, …; the run "
                         "directory's legion.log has everything"),
    ("LEGION_CGROUPS", "0, no, off or false: contain a run's processes without cgroups (`legion doctor` "
                       "says which containment a run uses and why)"),
    ("LEGION_RELAY_NOFILE", "the tcp monitor relay's soft open-file limit (default: raised to the hard one)"),
    ("LEGION_LEDGER_URL", "a postgresql:// URL: `legion run` records new runs there (overrides the setting "
                          "legion.ledger.url; `run --ledger` overrides it); `status|summary|events|monitor "
                          "--ledger` with no URL show its runs"),
    ("LEGION_FLEET_HEARTBEAT_S", "seconds between a run's heartbeats in the ledger's runs table (default 5); "
                                 "the fleet view shows a live run `lost` after 3 of them without one"),
    ("LEGION_LEDGER_PASSWORD", "the password of a PostgreSQL ledger whose URL names none (PGPASSWORD and "
                               "~/.pgpass work too); a run hands it to its own processes, never to its sessions"),
    ("NO_COLOR", "set: the live view uses no colour"),
    ("XDG_CONFIG_HOME", "the user's settings, cards and keys are under $XDG_CONFIG_HOME/legion (default "
                        "~/.config/legion)"),
    ("PI_CODING_AGENT_DIR", "where pi's models.json is read from (default ~/.pi/agent)"),
)
TOOL_ENVIRONMENT: Final[tuple[tuple[str, str], ...]] = (
    ("LEGION_NODE_ID", "the session's node name"),
    ("LEGION_ROLE", "its role (card)"),
    ("LEGION_TEAM", "its team, when it has one"),
)


_WIDTH = 100


def _table(rows: tuple[tuple[object, str], ...], width: int) -> str:
    """`  NAME  what …` rows, the text wrapped under itself."""
    return "\n".join(_fill(what, f"  {name!s:<{width}} ", " " * (width + 3)) for name, what in rows)


def _fill(text: str, first: str, rest: str) -> str:
    return textwrap.fill(text, _WIDTH, break_on_hyphens=False, initial_indent=first, subsequent_indent=rest)


def top_epilog() -> str:
    """`legion --help` after the commands: examples, exit statuses, environment variables."""
    from legion.workers.providers.config import ALWAYS_BUILTIN, BUILTINS

    others = ", ".join(b.key_env for name, b in BUILTINS.items() if name not in ALWAYS_BUILTIN)
    environment = (*ENVIRONMENT[:3], (others, "the keys of the other known providers, once they are configured "
                                              "under `providers` in the settings (docs/settings.md)"), *ENVIRONMENT[3:])
    described = "\n".join(f"  {name}\n" + _fill(what, " " * 6, " " * 6) for name, what in environment)
    return "\n".join([
        "examples:", _indent(TOP_EXAMPLES), "",
        "exit statuses:", _table(EXIT_STATUSES, 4), "",
        "environment:", described, "",
        "set by legion in each session's tool processes:", _table(TOOL_ENVIRONMENT, 15), "",
        "shell completion: `legion completion --help`; every settings key: docs/settings.md",
    ])


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())


class _TopParser(argparse.ArgumentParser):
    """The top-level parser: its epilog names the providers' key variables, read only when help is shown (the
    provider table costs every command its import otherwise)."""

    def format_help(self) -> str:
        self.epilog = top_epilog()
        return super().format_help()


def top_parser(**kwargs: Any) -> argparse.ArgumentParser:
    return _TopParser(formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)


def add_examples(parser: argparse.ArgumentParser) -> None:
    """Every subcommand's `--help` ends with its examples (kept as written: RawDescriptionHelpFormatter)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                sub.formatter_class = argparse.RawDescriptionHelpFormatter
                sub.epilog = "examples:\n" + _indent(EXAMPLES[name])
