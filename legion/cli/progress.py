"""How a run in this process shows its progress (`legion run`, `resume` and `demo`), from the run's monitor stream
(the root's publisher): on a TTY a live tree (rich `Live`, ≤ 10 redraws a second), without one a plain line per
lifecycle event on stderr plus a `progress` line every `--progress-every` seconds while a node is live (so that CI
jobs that kill a silent job are not fooled by a long model call). With `--json` (`--output-format stream-json`)
stdout has one public event per line (docs/events.md: `run_started` first, `result` last); with
`--output-format json` only the `result` object, the plain lines going to stderr. Each retry of a model request is a
plain line on stderr in every mode. stdout carries results, stderr diagnostics.
"""

from __future__ import annotations

import os
import shlex
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import orjson
from loguru import logger
from rich.console import Console
from rich.live import Live
from rich.text import Text

from legion.bus.protocol import (
    LAUNCH_ADMITTED,
    LAUNCH_QUEUED,
    NODE_PROBLEM,
    NODE_STATUS,
    RETRY_EVENTS,
    SUPERVISOR_EXITED,
    TEXT_DELTA,
)
from legion.ledger.constants import (
    LIVE_STATUSES,
    NODE_FAILED,
    NODE_LAUNCHED,
    NODE_RESUMED,
    NODE_RETIRED,
    NODE_SETTLED,
)
from legion.reports import events as public
from legion.reports.costs import cost_text, unknown_note
from legion.reports.views import plural, printable
from legion.run_errors import EXIT_PAUSED
from legion.workers.providers.retry import describe_retry

if TYPE_CHECKING:  # the run machinery is imported when a run starts: other commands start fast
    from legion.orchestration.run import RunResult
    from legion.prepare import Prepared
    from legion.supervision.root import RootSupervisor

LIFECYCLE = (NODE_STATUS, NODE_LAUNCHED, NODE_SETTLED, NODE_FAILED, NODE_RETIRED, NODE_RESUMED, NODE_PROBLEM,
             LAUNCH_QUEUED, LAUNCH_ADMITTED, SUPERVISOR_EXITED)
_STYLE = {"running": "yellow", "starting": "yellow", "blocked": "magenta", "settled": "green", "failed": "red",
          "retired": "dim"}
_SYMBOL = {"starting": "…", "running": "▶", "settled": "✔", "failed": "✗", "retired": "■", "blocked": "⏸"}


PROGRESS_EVERY_S = 30.0  # the plain view's default: CI systems commonly kill a job after minutes of silence
OUTPUT_FORMATS = ("text", "stream-json", "json")  # `--output-format`; `--json` is stream-json


def make_view(output: str = "text", progress_every: float = PROGRESS_EVERY_S,
              started: dict[str, Any] | None = None) -> View:
    """`stream-json`: the public events on stdout (`started`, the `run_started` event, first); `json`: plain lines on
    stderr, then the `result` object alone on stdout; `text`: the live tree on a terminal, else plain lines on stderr (with a
    progress line every `progress_every` seconds while a node is live; 0 turns it off)."""
    if output == "stream-json":
        return JsonView(sys.stdout, started)
    if output == "json":
        return ResultView(sys.stdout, progress_every)
    return LiveView() if sys.stderr.isatty() else LineView(sys.stderr, progress_every=progress_every)


def output_format(args: Any) -> str:
    """The output format of a `run`/`resume`/`demo` command line (`--json` is `--output-format stream-json`)."""
    return "stream-json" if getattr(args, "json", False) else getattr(args, "output_format", None) or "text"


def run_started_event(prepared: Prepared, *, resumed: bool = False) -> dict[str, Any]:
    """The `run_started` event of a prepared run (docs/events.md)."""
    opts = prepared.options
    return public.run_started(run=prepared.run_id, run_dir=prepared.run_dir, cwd=opts.cwd,
                              model=prepared.model or opts.model, agent=opts.agent, team=opts.team,
                              settings=prepared.settings.data, resumed=resumed)


def progress_seconds(text: str) -> float:
    """`--progress-every`'s value: seconds ≥ 0, finite (0 turns the progress lines off)."""
    import argparse
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds ≥ 0 (0 turns it off), not {text!r}")
    return value


def quiet_logs(view: View | None = None) -> None:
    """Diagnostics on stderr are warnings and errors only (LEGION_LOG_LEVEL changes it); the run directory's
    legion.log and pool.log have everything. Under the live view they are printed above its frame."""
    logger.remove()
    logger.add(view.log_sink if isinstance(view, LiveView) else sys.stderr, level=os.environ.get("LEGION_LOG_LEVEL", "WARNING").upper(),
               format="{time:HH:mm:ss} {level} {message}")


def view_tap(view: View) -> Callable[[RootSupervisor], None]:
    """An `on_root` hook: the view sees what the root's monitor publishes (in-process, no socket)."""

    def attach(root: RootSupervisor) -> None:
        """The view reads what the monitor stream publishes (in this process: no socket in between)."""
        monitor = root.monitor
        if monitor is None:
            return

        def show(type_: str, body: dict[str, Any]) -> None:
            try:
                view.event(type_, body, monitor.last_seq)  # a tap runs once the event has its seq
            except Exception as exc:  # the display never breaks the run
                logger.warning("progress view failed on {}: {!r}", type_, exc)

        monitor.tap(show)

    return attach


class View:
    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.nodes: dict[str, dict[str, Any]] = {}

    def event(self, type_: str, body: dict[str, Any], seq: int | None = None) -> None:
        node = body.get("node_id")
        if isinstance(node, str) and "status" in body and not body.get("infra"):
            self.nodes.setdefault(node, {}).update(status=body["status"])
            if "parent_id" in body:
                self.nodes[node]["parent"] = body["parent_id"]

    def close(self) -> None:
        pass

    def summary(self, result: RunResult) -> None:
        out = sys.stdout
        if result.final_text:
            out.write(printable(result.final_text.rstrip(), lines=True) + "\n\n")
        out.write(f"── legion run {result.run_id}: {result.status} (exit {result.exit_code}) in {result.wall_s:.1f}s\n")
        if result.detail:
            out.write(f"   {printable(result.detail)}\n")
        for row in result.nodes:
            out.write(_row_line(row) + "\n")
        for b in result.branches:  # teams: delivered branches, sha read from git
            out.write(f"   ⎇ {printable(b['node'])}: branch {printable(b['branch'])} @ "
                      f"{printable(b.get('sha') or '(missing)')} (phase {printable(b.get('phase'))})\n")
        total = sum(r.get("cost_usd", 0.0) for r in result.nodes)
        tokens = sum(r.get("tokens_in", 0) + r.get("tokens_out", 0) for r in result.nodes)
        unknown = sum(int(r.get("unknown_cost_tokens", 0)) for r in result.nodes)
        out.write(f"   total: {tokens} tokens, ${total:.4f}{unknown_note(unknown)} · run directory {result.run_dir}\n")
        if result.exit_code == EXIT_PAUSED:
            out.write(f"   paused: `{resume_command(result)}` continues it\n")


def retry_text(type_: str, body: dict[str, Any]) -> str:
    """A retry event as a plain line (docs/events.md, "Retries")."""
    node = body.get("node_id") or body.get("nodeId") or "-"
    return f"{type_:<16} {node} {describe_retry(type_, body)}"


def resume_command(result: RunResult) -> str:
    """The command that continues a paused run, typed from here (`-C` when this is not its project)."""
    project = result.run_dir.parent.parent.parent  # PROJECT/.legion/runs/RUN
    here = Path.cwd().resolve() == project.resolve()
    return f"legion {'' if here else f'-C {shlex.quote(str(project))} '}resume {shlex.quote(result.run_id)}"


def _row_line(row: dict[str, Any]) -> str:
    indent = "  " * int(row.get("depth") or 0)
    tokens = int(row.get("tokens_in", 0)) + int(row.get("tokens_out", 0))
    return (f"   {indent}{_SYMBOL.get(row['status'], '?')} {printable(row['name'])} [{printable(row['role'])}] "
            f"{printable(row['status'])} · {printable(row.get('model') or '-')} · {tokens} tok · "
            f"{cost_text(float(row.get('cost_usd', 0.0)), int(row.get('unknown_cost_tokens', 0)))}")


class LineView(View):
    """One plain line per lifecycle event (CI logs), and every `progress_every` seconds while a node is live a
    `progress` line: nodes live and settled, tokens, cost, elapsed (a thread: a long model call sends no event)."""

    def __init__(self, stream: TextIO, progress_every: float = PROGRESS_EVERY_S) -> None:
        super().__init__()
        from legion.reports.live_tree import TreeModel

        self.stream = stream
        self.model = TreeModel()
        self._write_lock = threading.Lock()  # the root's loop and the progress thread both write lines
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if progress_every > 0:
            self._ticker = threading.Thread(target=self._tick, args=(progress_every,), name="legion-progress",
                                            daemon=True)
            self._ticker.start()

    def event(self, type_: str, body: dict[str, Any], seq: int | None = None) -> None:
        super().event(type_, body)
        if type_ != TEXT_DELTA:
            self.model.apply(type_, body)
        if type_ in RETRY_EVENTS:
            self._line(retry_text(type_, body))
            return
        if type_ not in LIFECYCLE or body.get("infra"):
            return
        node = body.get("node_id") or body.get("supervisor") or "-"
        status = body.get("status", "")
        extra = body.get("reason") or body.get("what") or ""
        extra = "" if extra == status else extra  # "root failed", not "root failed failed"
        self._line(" ".join(part for part in (f"{type_:<16}", node, status, extra) if part))

    def snapshot(self, state: dict[str, Any], seq: int, *, first: bool = True) -> None:
        """A monitor snapshot (`legion monitor`): a line saying where the stream stands, then the tree as it stands,
        one line per agent node as in the run's summary."""
        self.model.snapshot(state)
        ordered = self.model.ordered()
        live = sum(1 for r, _ in ordered if r.status in LIVE_STATUSES)
        what = "attached" if first else "resynced"  # a gap or a restarted root: the state is taken afresh
        self._line(f"{what:<16} at event {seq}: {plural(len(ordered), 'node')}, {live} live")
        for row, depth in ordered:
            self._line(_row_line({"name": row.name, "role": row.role or "-", "status": row.status, "model": row.model,
                                  "depth": depth, "tokens_in": row.tokens, "cost_usd": row.cost,
                                  "unknown_cost_tokens": int(row.unknown_cost)}).removeprefix("   "))

    def _line(self, text: str) -> None:
        with self._write_lock:
            self.stream.write(printable(f"{time.monotonic() - self.t0:7.2f}s {text}") + "\n")
            self.stream.flush()

    def progress_line(self) -> str | None:
        """The progress line's text, or None when no node is live (nothing to report)."""
        totals = self.model.totals()
        if not totals["live"]:
            return None
        elapsed = int(time.monotonic() - self.t0)
        return (f"{'progress':<16} {totals['live']} live, {totals['settled']} settled, {totals['failed']} failed · "
                f"{totals['tokens']} tok · {cost_text(totals['cost'], int(totals['unknown_cost']))} · "
                f"elapsed {elapsed // 60}:{elapsed % 60:02d}")

    def _tick(self, every: float) -> None:
        while not self._stop.wait(every):
            try:
                line = self.progress_line()
                if line is not None:
                    self._line(line)
            except Exception as exc:  # the display never breaks the run
                logger.warning("progress line failed: {!r}", exc)

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(5)


class JsonView(View):
    """The public events on `stream` (docs/events.md): `run_started`, every monitor event but `text_delta`, then the
    `result`; a retry is also a plain line on stderr."""

    def __init__(self, stream: TextIO, started: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.stream = stream
        self.run = started["run"] if started else ""
        self.last_seq = 0
        if started is not None:
            self._write(started)

    def _write(self, event: dict[str, Any]) -> None:
        self.stream.write(orjson.dumps(event, default=str).decode() + "\n")
        self.stream.flush()

    def event(self, type_: str, body: dict[str, Any], seq: int | None = None) -> None:
        if type_ in RETRY_EVENTS:
            _stderr_line(retry_text(type_, body))
        if type_ == TEXT_DELTA:
            return
        self.last_seq = self.last_seq + 1 if seq is None else seq
        self._write(public.public_event(type_, body, run=self.run, seq=self.last_seq))

    def summary(self, result: RunResult) -> None:
        self._write(public.result(result, seq=self.last_seq + 1,
                                  resume=resume_command(result) if result.exit_code == EXIT_PAUSED else None))


class ResultView(LineView):
    """`--output-format json`: the plain lines on stderr while the run goes, then the `result` object alone on
    `stream` (as `claude -p --output-format json` prints one result)."""

    def __init__(self, stream: TextIO, progress_every: float = PROGRESS_EVERY_S) -> None:
        super().__init__(sys.stderr, progress_every=progress_every)
        self.out = stream
        self.last_seq = 0

    def event(self, type_: str, body: dict[str, Any], seq: int | None = None) -> None:
        super().event(type_, body, seq)
        self.last_seq = self.last_seq + 1 if seq is None else seq

    def summary(self, result: RunResult) -> None:
        event = public.result(result, seq=self.last_seq + 1,
                              resume=resume_command(result) if result.exit_code == EXIT_PAUSED else None)
        self.out.write(orjson.dumps(event, default=str).decode() + "\n")
        self.out.flush()


def _stderr_line(text: str) -> None:
    sys.stderr.write(printable(text) + "\n")
    sys.stderr.flush()


class LiveView(View):
    """The live tree on a terminal (stderr): status, phase, model, turns, tokens, cost and elapsed time per node,
    from the monitor stream. rich redraws at most 10 times a second; the text is rebuilt only when an event
    changed it or a second passed (the clocks), so a busy tree costs the root little. NO_COLOR is honoured
    (rich reads it); the final summary follows on stdout."""

    def __init__(self, console: Console | None = None) -> None:
        super().__init__()
        from legion.reports.live_tree import TreeModel

        self.model = TreeModel()
        self.console = console or Console(stderr=True)
        self.renders = 0
        self._cache: tuple[tuple[int, int, int, int], Text] | None = None
        self.live = Live(console=self.console, refresh_per_second=10, transient=True,
                         get_renderable=self._renderable, redirect_stdout=False, redirect_stderr=False)
        self.live.start()

    def event(self, type_: str, body: dict[str, Any], seq: int | None = None) -> None:
        super().event(type_, body)
        if type_ in RETRY_EVENTS:  # above the frame, as a log line
            self.console.print(Text(printable(retry_text(type_, body))), soft_wrap=True)
        if type_ != TEXT_DELTA:
            self.model.apply(type_, body)

    def _renderable(self) -> Text:
        width, height = self.console.size
        key = (self.model.version, int(time.monotonic() - self.model.t0), width, height)
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        self.renders += 1
        text = Text(no_wrap=True, overflow="crop")
        for n, (line, status) in enumerate(self.model.styled_lines(width, max(3, height - 1))):
            text.append(("\n" if n else "") + line, style=_STYLE.get(status or "", ""))
        self._cache = (key, text)
        return text

    def log_sink(self, message: Any) -> None:
        """A log line above the live frame: a raw write to the terminal would push the frame down, and its top
        lines would stay behind when the frame is cleared (on Ctrl-C, say)."""
        self.console.print(Text(str(message).rstrip("\n")), soft_wrap=True)

    def close(self) -> None:
        self.live.stop()
