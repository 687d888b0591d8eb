"""Tool-call guard (the child-guard of docs/spec-conformance.md §3.5): budgets, read-only discipline, ledger refusal.

It is discipline, not a sandbox: it refuses the obvious ways a session could exceed its budget,
mutate files in a read-only acceptance role, or touch ``legion.db`` directly.

- ``turnBudget``: at most N model calls (assistant turns) over the session's life, counted from the
  transcript on resume. ``toolBudget``: at most N tool calls.
- ``acceptance.role: read-only``: ``write``/``edit`` are refused; a ``bash`` command is refused when any
  pipeline segment starts with a mutating command (``MUTATING_COMMANDS``, ``git`` write subcommands,
  ``sed -i``, package installs) or the text has an output redirection other than to ``/dev/null`` or
  ``&1``/``&2``; ``bash -c``/``sh -c``/``eval`` text is checked the same way, and a shell running a
  script file or stdin (text it cannot see) is refused. A project's own checks are reads, so a read-only
  reviewer can run them: ``npm``/``pnpm``/``yarn`` ``test`` or ``run <script>`` whose script is a check
  (``test``, ``lint``, ``typecheck``, ``check``, … or ``test:unit``-like), ``make`` with only check targets,
  ``cargo test``/``check``/``clippy``/``fmt --check``. The guard tells them apart by the command's verb
  alone: what a project's check script does inside (coverage files, snapshot updates) is discipline.
- ``legion.db``: any path argument naming ``legion.db`` (or its ``-wal``/``-shm``/``-journal``), directly,
  through a symlink or ``..``, or the session's ledger path, or another name (a hard link) for one of the
  ledger's files (same device and inode), and any bash text mentioning ``legion.db``, is refused — the
  ledger is only reached through the legion tools. The file tools check the inode again on the file they
  opened, so a link made after this check is refused as well.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from legion.workers.context import SessionContext
from legion.workers.tools.files import is_ledger_file, ledger_ids

MUTATING_COMMANDS = frozenset({
    "rm", "rmdir", "mv", "cp", "mkdir", "touch", "chmod", "chown", "chgrp", "ln", "dd", "truncate", "shred",
    "install", "tee", "patch", "unlink", "rsync", "mkfifo", "mknod", "useradd", "kill", "pkill", "killall",
    "apt", "apt-get", "dnf", "yum", "brew", "npm", "pnpm", "yarn", "cargo", "make", "sudo", "su", "crontab"})
GIT_WRITE = frozenset({
    "add", "am", "apply", "branch", "checkout", "cherry-pick", "clean", "clone", "commit", "fetch", "gc", "init",
    "merge", "mv", "prune", "pull", "push", "rebase", "reset", "restore", "revert", "rm", "stash", "switch", "tag",
    "worktree", "update-ref", "config"})
WRAPPERS = frozenset({"env", "command", "nice", "nohup", "time", "timeout", "xargs", "exec", "builtin"})
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh"})
_SEGMENT_SPLIT = re.compile(r"\|\||&&|[;|&\n()`]|\$\(")
_REDIRECT = re.compile(r"(?<![<&\d])\d*>>?\s*(?!&\d|\s*/dev/null)|&>>?\s*(?!/dev/null)")
_OPERATOR_CHARS = frozenset("();<>|&")
_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_WRAPPER_ARG = re.compile(r"^[+-]?\d+(\.\d+)?[smhd]?$")  # timeout 5 / nice -n 10: a wrapper's number
_LEDGER_TEXT = re.compile(r"legion\.db", re.IGNORECASE)
# A project's test, lint and type-check commands (docs/spec-conformance.md §3.5): a read-only role may run them.
CHECK_VERBS = frozenset({"test", "tests", "lint", "typecheck", "type-check", "types", "check", "verify", "tsc",
                         "format:check", "fmt:check", "spec", "e2e"})
_JS_RUNNERS = frozenset({"npm", "pnpm", "yarn"})
_VALUE_FLAGS = {  # flags whose value is the next word, per runner
    "js": frozenset({"--prefix", "-C", "--dir", "--cwd", "--workspace", "-w", "--filter", "-F"}),
    "make": frozenset({"-C", "-f", "--directory", "--file", "--makefile", "-j", "--jobs", "-I", "-o", "-W"}),
}


def _positionals(args: list[str], value_flags: frozenset[str]) -> list[str]:
    """The words of `args` that are neither flags nor a flag's value (nor a make-style VAR=value)."""
    out, skip = [], False
    for w in args:
        if skip:
            skip = False
        elif w in value_flags:
            skip = True
        elif not w.startswith("-") and "=" not in w:
            out.append(w)
    return out


def _words(segment: str) -> list[str]:
    try:
        return shlex.split(segment, comments=True)
    except ValueError:
        return segment.split()


def _writes_by_redirection(command: str) -> bool:
    """Whether an unquoted ``>``-redirection writes anywhere but ``/dev/null`` or another descriptor.

    Shell tokens (quotes respected), so ``awk '$1 > 5'`` or ``echo "a -> b"`` are plain reads; text that
    does not tokenize, or has a command substitution, gets a raw-text check that errs on refusing."""
    raw_check = bool(_REDIRECT.search(command.replace("2>&1", "").replace(">&2", "")))
    if "$(" in command or "`" in command:
        return raw_check  # a substitution inside quotes still runs: judge the raw text
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError:
        return raw_check
    for i, token in enumerate(tokens):
        if ">" not in token or not set(token) <= _OPERATOR_CHARS:
            continue
        target = tokens[i + 1] if i + 1 < len(tokens) else ""
        if token.endswith(">&") and (target.isdigit() or target == "-"):
            continue  # 2>&1, >&2, 1>&-: descriptor duplication, no file
        if target != "/dev/null":
            return True
    return False


def mutating_reason(command: str) -> str | None:
    """Why ``command`` is not read-only, or None when it passes the conservative check."""
    if _writes_by_redirection(command):
        return "output redirection to a file"
    for segment in _SEGMENT_SPLIT.split(command):
        words = _words(segment.strip())
        while words and (_ASSIGN.match(words[0]) or words[0] in WRAPPERS or words[0].startswith("-")
                         or _WRAPPER_ARG.match(words[0])):
            words.pop(0)
        if not words:
            continue
        cmd = Path(words[0]).name
        rest = words[1:]
        if cmd in MUTATING_COMMANDS and not is_project_check(cmd, rest):
            return f"'{cmd}' modifies the system"
        nested = _nested_command(cmd, rest)
        if nested is not None:
            if nested == "":
                return f"'{cmd}' runs a script that cannot be checked"
            why = mutating_reason(nested)
            if why:
                return f"{why} (inside '{cmd}')"
        if cmd == "git":
            why = _git_reason(rest)
            if why:
                return why
        if cmd == "find" and ("-delete" in rest or any(
                w in ("-exec", "-execdir", "-ok") and i + 1 < len(rest) and Path(rest[i + 1]).name in MUTATING_COMMANDS
                for i, w in enumerate(rest))):
            return "'find' with -delete or a mutating -exec"
        if cmd in ("sed", "perl") and any(w.startswith("-i") or w == "--in-place" for w in rest):
            return f"'{cmd} -i' edits files in place"
        if cmd in ("pip", "pip3", "uv", "poetry") and any(w in ("install", "uninstall", "add", "remove", "sync")
                                                            for w in rest):
            return f"'{cmd}' changes installed packages"
        if cmd in ("python", "python3") and "-m" in rest and "pip" in rest:
            return "'python -m pip' changes installed packages"
    return None


def _is_check_name(name: str) -> bool:
    """`test`, `lint`, `typecheck`, or a variant of one (`test:unit`, `lint-fix` is not: only `:`/`.` suffixes)."""
    return name in CHECK_VERBS or re.split(r"[:.]", name, maxsplit=1)[0] in CHECK_VERBS - {"format:check"}


def is_project_check(cmd: str, args: list[str]) -> bool:
    """Whether `cmd args` runs a project's own test, lint or type-check command (a read for the guard)."""
    if cmd in _JS_RUNNERS:
        words = _positionals(args, _VALUE_FLAGS["js"])
        if not words:
            return False
        if words[0] in ("test", "t"):
            return True
        return words[0] in ("run", "run-script") and len(words) > 1 and _is_check_name(words[1])
    if cmd == "make":
        targets = _positionals(args, _VALUE_FLAGS["make"])
        return bool(targets) and all(_is_check_name(t) for t in targets)  # a bare `make` builds the default
    if cmd == "cargo":
        words = _positionals(args, frozenset())
        if not words:
            return False
        return words[0] in ("test", "check", "clippy") or (words[0] == "fmt" and "--check" in args)
    return False


_GIT_LISTING = {  # subcommand -> flags that make it a listing (a plain read)
    "branch": {"-a", "--all", "-r", "--remotes", "-l", "--list", "-v", "-vv", "--verbose", "--show-current",
               "--contains", "--no-contains", "--merged", "--no-merged", "--points-at", "--sort", "--format",
               "--column", "--no-column", "--color", "--no-color", "-i", "--ignore-case"},
    "tag": {"-l", "--list", "-n", "--contains", "--no-contains", "--merged", "--no-merged", "--points-at",
            "--sort", "--format", "--column", "--no-column", "-i", "--ignore-case"},
    "config": {"--get", "--get-all", "--get-regexp", "--get-urlmatch", "-l", "--list", "--show-origin",
               "--show-scope", "--name-only", "--null", "-z", "--global", "--system", "--local", "--worktree",
               "--file", "-f", "--type", "--bool", "--int", "--path", "--default", "--includes"},
}


_CONFIG_GETS = {"--get", "--get-all", "--get-regexp", "--get-urlmatch", "-l", "--list"}


def _git_reason(rest: list[str]) -> str | None:
    """Why a git command line writes, or None for reads — incl. listing forms of branch/tag/config/stash."""
    sub_at = next((i for i, w in enumerate(rest[:3]) if w in GIT_WRITE), None)
    if sub_at is None:
        return None
    sub, args = rest[sub_at], rest[sub_at + 1:]
    if sub in ("stash", "worktree") and args[:1] in (["list"], ["show"]):
        return None
    listing = _GIT_LISTING.get(sub)
    flags = {a.split("=", 1)[0] for a in args if a.startswith("-")}
    positional = [a for a in args if not a.startswith("-")]
    if listing is not None and flags <= listing:
        if sub == "config":
            if flags & _CONFIG_GETS or len(positional) == 1:  # git config --get k / --list / git config k
                return None
        elif flags & {"-l", "--list"} or not positional:  # git branch [-a] / git tag -l 'v*'
            return None
    return f"'git {sub}' modifies the repository"


def _nested_command(cmd: str, rest: list[str]) -> str | None:
    """The command text a shell (``bash -c …``, a script file, stdin) or ``eval`` would run: None when
    ``cmd`` runs no nested shell text, "" when the text cannot be seen (a script file or stdin)."""
    if cmd == "eval":
        return " ".join(rest)
    if cmd not in SHELLS:
        return None
    for i, word in enumerate(rest):
        if word.startswith("-") and not word.startswith("--") and "c" in word[1:]:
            return rest[i + 1] if i + 1 < len(rest) else ""
        if not word.startswith("-"):
            return ""  # bash script.sh: the script's text is not visible here
    return ""  # bash reading commands from stdin


@dataclass
class Guard:
    """Counts turns and tool calls for one session and vets every tool call before it runs."""

    context: SessionContext
    turns: int = 0
    tool_calls: int = 0

    def before_turn(self) -> str | None:
        limit = self.context.budget.turn_budget
        if limit is not None and self.turns >= limit:
            return f"turnBudget exhausted: {self.turns} of {limit} turn{'' if limit == 1 else 's'} used; the run stops here"
        self.turns += 1
        return None

    def tool_budget_refusal(self) -> str | None:
        """The refusal text when toolBudget is spent (the run stops), else None."""
        limit = self.context.budget.tool_budget
        if limit is not None and self.tool_calls >= limit:
            return (f"toolBudget exhausted: {self.tool_calls} of {limit} tool call{'' if limit == 1 else 's'} used; "
                    "this call was not run")
        return None

    def check_tool(self, name: str, args: Any) -> str | None:
        """Refusal text for this call, or None; a refused call still counts against toolBudget."""
        budget = self.tool_budget_refusal()
        if budget:
            return budget
        self.tool_calls += 1
        ledger = self._ledger_refusal(name, args)
        if ledger:
            return ledger
        if self.context.read_only:
            if name in ("write", "edit"):
                return f"{name} is not allowed: this session's acceptance role is read-only"
            if name == "bash" and isinstance(args, dict) and isinstance(args.get("command"), str):
                why = mutating_reason(args["command"])
                if why:
                    return f"bash command refused for a read-only session ({why}); inspect without modifying"
        return None

    def _ledger_refusal(self, name: str, args: Any) -> str | None:
        if not isinstance(args, dict):
            return None
        ledger = self.context.ledger_path
        for key, value in args.items():
            if not isinstance(value, str):
                continue
            if name == "bash" and key == "command" and (_LEDGER_TEXT.search(value) or
                                                         (ledger and ledger in value)):
                return "direct access to the legion ledger (legion.db) is refused; use the legion tools"
            if key == "path" and (is_ledger_file(_absolute(value, self.context.cwd)) or
                                  (ledger and _same(value, ledger, self.context.cwd)) or
                                  self._is_ledger_inode(_absolute(value, self.context.cwd))):
                return "direct access to the legion ledger (legion.db) is refused; use the legion tools"
        return None

    def _is_ledger_inode(self, path: Path) -> bool:
        """Whether ``path`` is another name (a hard link) for one of the ledger's files."""
        ids = ledger_ids(self.context.ledger_path, self.context.run_dir)
        return bool(ids) and _inode(path) in ids


def _inode(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()  # stat never blocks, not even on a FIFO
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def _absolute(path: str, cwd: str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path(cwd) / p


def _same(path: str, ledger: str, cwd: str) -> bool:
    p = _absolute(path, cwd)
    try:
        return p.resolve() == Path(ledger).resolve()
    except OSError:
        return False
