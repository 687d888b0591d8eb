"""Execution outcome of a run, derived only from its transcript (docs/spec-conformance.md §2.1).

The last turn is the last assistant message on the current branch; its ``stopReason`` and text output
decide:

=================================  ===========
last turn                          outcome
=================================  ===========
``stop`` with non-empty text       success
``stop`` with no text              failed (an empty final answer)
``length``                         truncated
``error``                          failed
``aborted``                        aborted
``toolUse`` (no final answer)      unknown
any other stop reason              failed (an unrecognised stop reason, named by ``failure_reason``)
no stop reason                     unknown
a user/tool message after it       unknown (the turn never completed; system notes are skipped)
no assistant message / no file     unknown
=================================  ===========

A run's result text (``final_result``) is the last turn's text, followed by why it failed when it ended
on a model error or an unrecognised stop reason: a parent reads the reason, not "(no final output)".

The supervisor maps ``success → settled``, ``failed|truncated → failed``, ``aborted|unknown → retired``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from legion.workers.transcript import Message, context_messages, read_transcript, text_of

Outcome = Literal["success", "failed", "truncated", "aborted", "unknown"]
OUTCOMES: tuple[Outcome, ...] = ("success", "failed", "truncated", "aborted", "unknown")
STOP_REASONS = frozenset({"stop", "length", "toolUse", "error", "aborted"})  # pi's AssistantMessage stopReason


def outcome_of_messages(messages: list[Message]) -> Outcome:
    """Outcome from an LLM-context message list (see the module table)."""
    for msg in reversed(messages):
        role = msg.get("role")
        if msg.get("customType"):
            continue  # marked system notes (e.g. "worker restarted") are not turns
        if role != "assistant":
            # a user/toolResult message after the last assistant means the turn never completed
            return "unknown"
        reason = msg.get("stopReason")
        if reason == "stop":
            return "success" if text_of(msg).strip() else "failed"
        if reason == "length":
            return "truncated"
        if reason == "error":
            return "failed"
        if reason == "aborted":
            return "aborted"
        if reason is None or reason == "toolUse":
            return "unknown"
        return "failed"  # the turn ended in a way nobody recognises: not a success, and not a missing turn
    return "unknown"


def _last_turn(messages: list[Message]) -> Message | None:
    """The last assistant message when nothing but system notes follows it, else None."""
    for msg in reversed(messages):
        if msg.get("customType"):
            continue
        return msg if msg.get("role") == "assistant" else None
    return None


def failure_reason(messages: list[Message]) -> str | None:
    """Why the last turn failed, when it ended on a model error or an unrecognised stop reason (else None)."""
    msg = _last_turn(messages)
    if msg is None:
        return None
    reason = msg.get("stopReason")
    if reason == "error":
        error = msg.get("errorMessage")
        return str(error) if error else "the model call failed (no error message was recorded)"
    if reason is not None and reason not in STOP_REASONS:
        return f"the model stopped with an unrecognised stop reason {str(reason)!r}"
    return None


def result_text(messages: list[Message]) -> str:
    """The last turn's text output, then ``(failed: why)`` when it failed on a model error or stop reason."""
    text = last_turn_output(messages)
    why = failure_reason(messages)
    if why is None:
        return text
    return f"{text.rstrip()}\n\n(failed: {why})" if text.strip() else f"(failed: {why})"


def last_turn_output(messages: list[Message]) -> str:
    """Text of the last assistant message (empty when there is none)."""
    for msg in reversed(messages):
        if msg.get("role") == "assistant":
            return text_of(msg)
    return ""


def derive_outcome(path: str | Path) -> Outcome:
    """success | failed | truncated | aborted | unknown for the transcript at ``path``."""
    try:
        data = read_transcript(path)
    except OSError:
        return "unknown"
    return outcome_of_messages(context_messages(data.leaf_path()))


def final_result(path: str | Path) -> tuple[Outcome, str]:
    """(outcome, the result text: ``result_text``) of the transcript at ``path``; ("unknown", "") if unreadable."""
    try:
        data = read_transcript(path)
    except OSError:
        return "unknown", ""
    messages = context_messages(data.leaf_path())
    return outcome_of_messages(messages), result_text(messages)


@dataclass(frozen=True)
class FinalAnswer:
    """A run's completed final answer: its text and when it was written (ms since the epoch)."""

    text: str
    at_ms: int


def final_answer(path: str | Path) -> FinalAnswer | None:
    """The completed final answer the transcript at ``path`` ends with (outcome ``success``: a last assistant
    message with stop reason ``stop``, text and no tool call, nothing after it but system notes), else None."""
    try:
        data = read_transcript(path)
    except OSError:
        return None
    branch = data.leaf_path()
    messages = context_messages(branch)
    if outcome_of_messages(messages) != "success":
        return None
    entry = next((e for e in reversed(branch) if e.get("type") == "message"
                  and isinstance(e.get("message"), dict) and e["message"].get("role") == "assistant"), None)
    if entry is None:  # the answer is only in a compaction summary: nothing to date it by
        return None
    message = entry["message"]
    content = message.get("content")
    if isinstance(content, list) and any(isinstance(b, dict) and b.get("type") == "toolCall" for b in content):
        return None  # a tool call still pending: not a final answer
    return FinalAnswer(text_of(message), _entry_ms(entry))


def _entry_ms(entry: dict[str, Any]) -> int:
    """When an entry was appended: its ISO ``timestamp``, else its message's epoch-ms one, else 0."""
    stamp = entry.get("timestamp")
    if isinstance(stamp, str):
        try:
            return int(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000)
        except ValueError:
            pass
    raw = (entry.get("message") or {}).get("timestamp")
    return raw if isinstance(raw, int) and not isinstance(raw, bool) else 0


def run_ends(transcript: Path) -> int:
    """How many runs of a transcript ended (assistant turns that end a run: not a tool call, and not a turn its
    worker's stop cut — a pause's run goes on when the node is resumed)."""
    from legion.workers.session import CUT_STOP, RUN_CUT_TYPE  # (the session module imports this one)

    try:
        entries = read_transcript(transcript).leaf_path()
    except OSError:
        return 0
    ends, cut_open = 0, False
    for entry in entries:
        if entry.get("type") == "custom" and entry.get("customType") == RUN_CUT_TYPE and cut_open:
            data = entry.get("data")
            if isinstance(data, dict) and data.get("cause") == CUT_STOP:
                ends -= 1
            cut_open = False
            continue
        for m in context_messages([entry]):
            if m.get("role") == "assistant":
                ended = m.get("stopReason") in RUN_END_REASONS
                ends += ended
                cut_open = ended and m.get("stopReason") == "aborted"
    return ends


RUN_END_REASONS = frozenset({"stop", "length", "error", "aborted"})
