"""Stall notices as pure decisions (docs/spec-conformance.md §6.8): no clock reads, no I/O, never an abort.

The postman feeds each live child's activity (the last session event, the tools in flight, when its
current run began) and the child's `StallState`; `decide` returns at most one notice line for the
child (L1 wins over L2) and the next state. A *window* is one run of the child: it opens when the
child starts (or is woken for) a run, and the per-window notice limits count within it.

- L1 silence: no tool in flight **and** `now - last_event >= silence_ms`; a tool in flight never
  triggers L1 (a 10-minute build and a hung bash look the same). A second L1 only after another full
  silence period; at most `SILENCE_NOTICE_LIMIT` per window. `silence_ms` is the setting
  `legion.silenceNoticeMs`; 0 or less turns L1 off.
- L2 long-running: `now - run_started >= radius * (k + 1)` for the k-th notice of the window, at most
  `LONG_RUNNING_NOTICE_LIMIT`; the only notice that may cite evidence (the oldest tool in flight). The radius
  is the child's card `loopNoticeMs` (or `agentOverrides.<role>.loopNoticeMs`), else the setting
  `legion.loopNoticeMs` (`LOOP_NOTICE_MS`); 0 turns L2 off.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from legion.agents.settings_schema import LOOP_NOTICE_MS, SILENCE_NOTICE_MS

SILENCE_NOTICE_LIMIT = 2
LONG_RUNNING_NOTICE_LIMIT = 3


@dataclass(frozen=True, slots=True)
class StallConfig:
    silence_ms: int = SILENCE_NOTICE_MS
    silence_limit: int = SILENCE_NOTICE_LIMIT
    radius_ms: int = LOOP_NOTICE_MS
    long_limit: int = LONG_RUNNING_NOTICE_LIMIT


@dataclass(frozen=True, slots=True)
class Activity:
    """What the heartbeats and session events say about one live child (epoch ms)."""

    last_event_ms: int
    run_started_ms: int
    tools: tuple[tuple[str, int], ...] = ()  # (tool name, started at) of each tool in flight


@dataclass(frozen=True, slots=True)
class StallState:
    """Per child, per window: notices given and when the last L1 was."""

    window_ms: int = 0  # run_started of the window these counts belong to
    silence_sent: int = 0
    last_silence_ms: int = 0
    long_sent: int = 0


@dataclass(frozen=True, slots=True)
class Notice:
    level: Literal["L1", "L2"]
    subject: str
    text: str


def decide(child: str, now_ms: int, act: Activity, state: StallState,
           cfg: StallConfig = StallConfig()) -> tuple[Notice | None, StallState]:
    """At most one notice for `child` at `now_ms`, and the state to keep."""
    if state.window_ms != act.run_started_ms:
        state = StallState(window_ms=act.run_started_ms)
    notice = _silence(child, now_ms, act, state, cfg)
    if notice is not None:
        return notice, replace(state, silence_sent=state.silence_sent + 1, last_silence_ms=now_ms)
    notice = _long_running(child, now_ms, act, state, cfg)
    if notice is not None:
        return notice, replace(state, long_sent=state.long_sent + 1)
    return None, state


def _silence(child: str, now_ms: int, act: Activity, state: StallState, cfg: StallConfig) -> Notice | None:
    if cfg.silence_ms <= 0 or act.tools or state.silence_sent >= cfg.silence_limit:
        return None
    since = max(act.last_event_ms, state.last_silence_ms)
    if now_ms - since < cfg.silence_ms:
        return None
    quiet = _duration(now_ms - act.last_event_ms)
    return Notice("L1", f"Stall: {child} silent for {quiet}",
                  f"{child} has produced no session event for {quiet} and has no tool running. It may be stuck "
                  "waiting on a model call. Check it with `subagent status`; steer, abort or stop it if needed "
                  "(nothing is done automatically).")


def _long_running(child: str, now_ms: int, act: Activity, state: StallState, cfg: StallConfig) -> Notice | None:
    if cfg.radius_ms <= 0 or state.long_sent >= cfg.long_limit:
        return None
    ran = now_ms - act.run_started_ms
    if ran < cfg.radius_ms * (state.long_sent + 1):
        return None
    evidence = ""
    if act.tools:
        name, started = min(act.tools, key=lambda t: t[1])
        evidence = f"; in `{name}` for {_duration(now_ms - started)}"
    return Notice("L2", f"Stall: {child} running for {_duration(ran)}",
                  f"{child} has been running for {_duration(ran)}{evidence}. This is information, not a failure: "
                  "decide whether to let it go on, steer it, or stop it.")


def _duration(ms: int) -> str:
    seconds = max(0, ms) // 1000
    if seconds < 120:
        return f"{seconds} s"
    minutes = seconds // 60
    return f"{minutes} min" if minutes < 120 else f"{minutes // 60} h {minutes % 60} min"
