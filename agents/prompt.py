"""The system prompt a session starts with, composed from its role card (docs/spec-conformance.md §1.1 context fields).

`systemPromptMode: append` (default) puts the card body after legion's base prompt; `replace` uses
the card body alone. `inheritProjectContext` (default true) appends the project's instruction files
(`AGENTS.md`, else `CLAUDE.md`, from the filesystem root down to the working directory). `defaultReads`
appends the named files (relative to the working directory). Files are read with size caps; a missing
or unreadable file becomes a one-line note, never an exception.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from legion.agents.card import AgentConfig

MAX_FILE_CHARS: Final = 64 * 1024
CONTEXT_FILE_NAMES: Final = ("AGENTS.md", "CLAUDE.md")
# A folder whose mtime is this recent may change again within the same timestamp tick without its mtime moving
# (git's "racy" rule): its lookup is not cached until it has been still this long. Linux stamps files from a
# coarse clock, one tick (≤ 10 ms) behind: 100 ms leaves a margin.
SETTLED_NS: Final = 100_000_000
BASE_PROMPT: Final = """\
You are an agent in a legion: a supervised tree of agent sessions working on one task together.
Your role, your parent and your budget were chosen by whoever dispatched you.

- Work only on what you were asked to do. If the task is unclear or contradicts what you find,
  say so (mail your parent with `legion_mail` when you have it) instead of guessing.
- Use your tools deliberately: read before you edit, keep shell commands non-interactive and bounded,
  and never open the run's `legion.db` directly.
- `legion_mail` is asynchronous: sending never waits for a reply. Keep mail short (a subject of at
  most 256 bytes; a body under 4 KB, or write longer material to a file and send its path), and send
  few (the default limit is 10 per 5 minutes). Mail arriving for you is shown to you as a message.
- Your final answer is what your parent receives. Make it self-contained and factual: what you did,
  what you verified and how, what is still open. Never claim a result you did not observe."""


@dataclass(frozen=True)
class PromptParts:
    """The composed prompt and where its pieces came from (for display and debugging)."""

    text: str
    sources: tuple[str, ...]
    notes: tuple[str, ...] = ()


def compose_system_prompt(
    agent: AgentConfig,
    *,
    cwd: str | Path,
    task_context: str = "",
    base: str = BASE_PROMPT,
    stop_at: str | Path | None = None,
) -> PromptParts:
    """Base prompt (append mode) + card body + run/task context + project context + default reads."""
    sections: list[str] = []
    sources: list[str] = []
    notes: list[str] = []
    if agent.system_prompt_mode == "append" and base.strip():
        sections.append(base.strip())
        sources.append("<legion base prompt>")
    if agent.prompt.strip():
        sections.append(agent.prompt.strip())
        sources.append(agent.path or f"<card {agent.name}>")
    if task_context.strip():
        sections.append(task_context.strip())
        sources.append("<run context>")
    if agent.inherit_project_context:
        for path in project_context_files(cwd, stop_at=stop_at):
            text, note = _read_capped(path)
            if note:
                notes.append(note)
            if text:
                sections.append(f"# Project instructions ({path})\n\n{text}")
                sources.append(str(path))
    root = Path(cwd).resolve() if agent.default_reads else Path()
    for rel in agent.default_reads:
        path = (root / rel).resolve()
        text, note = ("", None)
        if not path.is_relative_to(root):  # e.g. a symlink pointing out of the checkout
            note = f"{rel} resolves outside the working directory ({path}); not read"
        else:
            text, note = _read_capped(path)
        if note:
            notes.append(note)
            sections.append(f"# {rel}\n\n({note})")
        else:
            sections.append(f"# {rel}\n\n{text}")
            sources.append(str(path))
    return PromptParts("\n\n".join(sections), tuple(sources), tuple(notes))


# (cwd, stop_at) → the folders' mtimes when looked up, and the files found then
_found_in: dict[tuple[str, str | None], tuple[tuple[int, ...], tuple[Path, ...]]] = {}


def project_context_files(cwd: str | Path, *, stop_at: str | Path | None = None) -> list[Path]:
    """One instruction file per directory (AGENTS.md before CLAUDE.md), outermost first.

    Every launch composes a prompt: the lookup is remembered per folder chain and redone when a folder of
    it changed (a file created, removed or renamed in it moves its mtime), at one stat per folder."""
    key, chain = _chain(str(cwd), str(stop_at) if stop_at is not None else None)
    stamps = _mtimes(chain)
    known = _found_in.get(key)
    if stamps is not None and known is not None and known[0] == stamps:
        return list(known[1])
    found: list[Path] = []
    for directory in reversed(chain):
        hit = _first_existing(directory, CONTEXT_FILE_NAMES)
        if hit is not None:
            found.append(hit)
    if stamps is not None and max(stamps) < _now_ns() - SETTLED_NS:
        _found_in[key] = (stamps, tuple(found))
    return found


_now_ns = time.time_ns  # (a test's clock)


@functools.lru_cache(maxsize=256)
def _chain(cwd: str, stop_at: str | None) -> tuple[tuple[str, str | None], tuple[Path, ...]]:
    """The lookup's key and its folders, `cwd` resolved up to `stop_at` (or the filesystem root).

    Remembered per path for the process: a run's launches share a few working directories, and resolving one
    is a `lstat` per component. A folder of the chain that is replaced by a symlink afterwards is not followed."""
    start = Path(cwd).resolve()
    limit = Path(stop_at).resolve() if stop_at is not None else None
    chain: list[Path] = []
    for directory in (start, *start.parents):
        chain.append(directory)
        if limit is not None and directory == limit:
            break
    return (str(start), str(limit) if limit is not None else None), tuple(chain)


def _mtimes(chain: Sequence[Path]) -> tuple[int, ...] | None:
    try:
        return tuple(os.stat(directory).st_mtime_ns for directory in chain)
    except OSError:
        return None


def _first_existing(directory: Path, names: Sequence[str]) -> Path | None:
    for name in names:
        candidate = directory / name
        try:
            if candidate.is_file():
                return candidate
        except OSError:
            continue
    return None


def _read_capped(path: Path) -> tuple[str, str | None]:
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_FILE_CHARS * 4 + 1)
    except FileNotFoundError:
        return "", f"{path} does not exist"
    except OSError as exc:
        return "", f"{path} cannot be read: {exc.strerror or exc}"
    text = data.decode("utf-8", errors="replace").replace("\x00", "")
    if len(text) > MAX_FILE_CHARS:
        return text[:MAX_FILE_CHARS] + f"\n[… truncated at {MAX_FILE_CHARS} characters]", None
    return text, None
