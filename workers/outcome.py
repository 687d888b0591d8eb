"""Execution outcome of a run, derived only from its transcript (SEED-SPEC §2.1).

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
a user/tool message after it       unknown (the turn never completed; system notes are skipped)
no assistant message / no file     unknown
=================================  ===========

The supervisor maps ``success → settled``, ``failed|truncated → failed``, ``aborted|unknown → retired``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from legion.workers.transcript import Message, context_messages, read_transcript, text_of

Outcome = Literal["success", "failed", "truncated", "aborted", "unknown"]
OUTCOMES: tuple[Outcome, ...] = ("success", "failed", "truncated", "aborted", "unknown")


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
        return "unknown"
    return "unknown"


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
    """(outcome, the last turn's text output) of the transcript at ``path``; ("unknown", "") if unreadable."""
    try:
        data = read_transcript(path)
    except OSError:
        return "unknown", ""
    messages = context_messages(data.leaf_path())
    return outcome_of_messages(messages), last_turn_output(messages)
