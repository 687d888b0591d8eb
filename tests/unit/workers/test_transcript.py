"""Transcripts: pi session JSONL v3 shape, line-atomic appends, resume, torn tails, pre-creation."""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import Any

import pytest

from legion.workers.transcript import (
    FsyncPolicy,
    Transcript,
    TranscriptError,
    context_messages,
    create_empty,
    read_transcript,
    user_texts_last_turns,
)

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
ROLES = {"user", "assistant", "toolResult", "bashExecution", "custom", "branchSummary", "compactionSummary"}
ENTRY_TYPES = {"message", "model_change", "thinking_level_change", "compaction", "branch_summary", "custom",
               "custom_message", "label", "session_info"}
STOP_REASONS = {"stop", "length", "toolUse", "error", "aborted"}
USAGE_KEYS = {"input", "output", "cacheRead", "cacheWrite", "totalTokens", "cost"}


def check_pi_format(path: Path) -> list[dict[str, Any]]:
    """Validate a file against pi's session.md v3 rules; return its entries."""
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    assert header["type"] == "session" and header["version"] == 3
    assert isinstance(header["id"], str) and ISO.match(header["timestamp"]) and isinstance(header["cwd"], str)
    assert "parentId" not in header
    entries = [json.loads(line) for line in lines[1:]]
    seen: set[str] = set()
    prev: str | None = None
    for e in entries:
        assert e["type"] in ENTRY_TYPES
        assert re.fullmatch(r"[0-9a-f]{8}", e["id"]) and e["id"] not in seen
        assert e["parentId"] == prev  # legion writes a single linear branch
        assert ISO.match(e["timestamp"])
        seen.add(e["id"])
        prev = e["id"]
        if e["type"] == "message":
            m = e["message"]
            assert m["role"] in ROLES and isinstance(m["timestamp"], int)
            if m["role"] == "assistant":
                assert m["stopReason"] in STOP_REASONS and set(m["usage"]) == USAGE_KEYS
                assert isinstance(m["provider"], str) and isinstance(m["model"], str) and isinstance(m["api"], str)
                for block in m["content"]:
                    assert block["type"] in ("text", "thinking", "toolCall")
                    if block["type"] == "toolCall":
                        assert isinstance(block["arguments"], dict) and block["id"] and block["name"]
            if m["role"] == "toolResult":
                assert m["toolCallId"] and m["toolName"] and isinstance(m["isError"], bool)
                assert all(b["type"] == "text" for b in m["content"])
        if e["type"] == "custom":
            assert isinstance(e["customType"], str) and "data" in e
        if e["type"] == "custom_message":
            assert isinstance(e["customType"], str) and isinstance(e["display"], bool)
    return entries


def _assistant(text: str, stop: str = "stop") -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "text": text}], "api": "scripted",
            "provider": "scripted", "model": "x", "stopReason": stop, "timestamp": 1,
            "usage": {"input": 1, "output": 1, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 2,
                      "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0}}}


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}], "timestamp": 1}


def test_create_empty_precreates_file(tmp_path: Path) -> None:
    p = create_empty(tmp_path / "runs" / "a" / "s.jsonl")
    assert p.exists() and p.stat().st_size == 0
    assert oct(p.stat().st_mode & 0o777) == "0o600"
    t = Transcript.open(p, cwd=str(tmp_path), provider="scripted", model_id="echo", thinking="off")
    t.close()
    assert check_pi_format(p)[0]["type"] == "model_change"


def test_round_trip_and_pi_format(tmp_path: Path) -> None:
    p = tmp_path / "s.jsonl"
    t = Transcript.open(p, cwd="/w", provider="openai", model_id="gpt-4o", thinking="high")
    t.append_message(_user("hi"))
    t.append_message(_assistant("hello"))
    t.append_custom("legion.empty_generation_retry", {"attempt": 1})
    t.append_note("legion.worker_restart", "restarted")
    t.close()
    entries = check_pi_format(p)
    assert [e["type"] for e in entries] == ["model_change", "thinking_level_change", "message", "message",
                                            "custom", "custom_message"]
    data = read_transcript(p)
    assert data.header is not None and data.header["cwd"] == "/w"
    t2 = Transcript.open(p, cwd="/w")
    assert t2.resumed and t2.leaf_id == entries[-1]["id"]
    msgs = t2.messages()
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"]  # custom excluded, custom_message in
    t2.append_message(_user("again"))
    t2.close()
    entries = check_pi_format(p)
    assert entries[-1]["parentId"] == entries[-2]["id"]


def test_resume_tolerates_torn_last_line(tmp_path: Path) -> None:
    p = tmp_path / "s.jsonl"
    t = Transcript.open(p, cwd="/w")
    t.append_message(_user("one"))
    t.close()
    with open(p, "ab") as f:
        f.write(b'{"type":"message","id":"dead')  # a crash mid-write
    t = Transcript.open(p, cwd="/w")
    assert [m["role"] for m in t.messages()] == ["user"]
    t.append_message(_assistant("two"))
    t.close()
    check_pi_format(p)
    torn = list(tmp_path.glob("s.jsonl.torn-*"))
    assert len(torn) == 1 and torn[0].read_bytes() == b'{"type":"message","id":"dead'


def test_complete_last_line_without_newline_is_kept(tmp_path: Path) -> None:
    p = tmp_path / "s.jsonl"
    t = Transcript.open(p, cwd="/w")
    t.append_message(_user("one"))
    t.close()
    p.write_bytes(p.read_bytes().rstrip(b"\n"))
    t = Transcript.open(p, cwd="/w")
    t.append_message(_user("two"))
    t.close()
    assert [m["content"][0]["text"] for m in Transcript.open(p, cwd="/w").messages()] == ["one", "two"]


def test_refuses_non_pi_file(tmp_path: Path) -> None:
    p = tmp_path / "s.jsonl"
    p.write_text('{"hello": 1}\n')
    with pytest.raises(TranscriptError, match="not a pi session file"):
        Transcript.open(p, cwd="/w")


def test_bad_middle_lines_are_skipped_by_reader(tmp_path: Path) -> None:
    p = tmp_path / "s.jsonl"
    t = Transcript.open(p, cwd="/w")
    t.append_message(_user("a"))
    t.close()
    with open(p, "ab") as f:
        f.write(b"garbage\n")
    data = read_transcript(p)
    assert data.bad_lines == [3] and len(data.entries) == 1


def test_appends_are_line_atomic_under_concurrency(tmp_path: Path) -> None:
    p = tmp_path / "s.jsonl"
    writers = [Transcript.open(p, cwd="/w", fsync=FsyncPolicy.NEVER) for _ in range(4)]
    big = "x" * 20000

    def work(t: Transcript) -> None:
        for i in range(50):
            t.append_message(_user(f"{i}{big}"))

    threads = [threading.Thread(target=work, args=(t,)) for t in writers]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for t in writers:
        t.close()
    lines = p.read_bytes().split(b"\n")
    assert lines[-1] == b""
    assert sum(1 for line in lines[1:-1] if json.loads(line)["type"] == "message") == 200


def test_user_texts_last_turns_window(tmp_path: Path) -> None:
    p = tmp_path / "s.jsonl"
    t = Transcript.open(p, cwd="/w")
    for i in range(25):
        t.append_message(_user(f"u{i}"))
        t.append_message(_assistant(f"a{i}"))
    t.close()
    texts = user_texts_last_turns(p, 20)
    assert texts[0] == "u5" and texts[-1] == "u24" and len(texts) == 20


def test_fsync_always_policy_writes(tmp_path: Path) -> None:
    p = tmp_path / "s.jsonl"
    t = Transcript.open(p, cwd="/w", fsync=FsyncPolicy.ALWAYS)
    t.append_message(_user("a"))
    size = os.path.getsize(p)
    t.close()
    assert size == os.path.getsize(p) and t.closed


def test_turn_window_groups_consecutive_user_messages(tmp_path: Path) -> None:
    p = tmp_path / "s.jsonl"
    t = Transcript.open(p, cwd="/w")
    t.append_message(_user("old"))
    t.append_message(_assistant("a"))
    t.append_message(_user("steer 1"))
    t.append_message(_user("steer 2"))
    t.append_note("legion.worker_restart", "note")
    t.append_message(_assistant("b"))
    t.append_message(_user("[legion mail #3] exact envelope"))
    t.close()
    assert user_texts_last_turns(p, 2) == ["steer 1", "steer 2", "[legion mail #3] exact envelope"]
    assert user_texts_last_turns(p, 0) == []


def test_context_follows_pi_compaction_and_branch_summaries(tmp_path: Path) -> None:
    p = tmp_path / "s.jsonl"
    t = Transcript.open(p, cwd="/w")
    t.append_message(_user("old 1"))
    t.append_message(_assistant("old answer"))
    kept = t.append_message(_user("kept"))
    t.append_message(_assistant("kept answer"))
    t.append({"type": "compaction", "summary": "we did X", "firstKeptEntryId": kept, "tokensBefore": 1000})
    t.append({"type": "branch_summary", "fromId": kept, "summary": "tried Y"})
    t.append_message(_user("new"))
    live = t.messages()
    t.close()
    msgs = Transcript.open(p, cwd="/w").messages()
    assert [m["content"] for m in live] == [m["content"] for m in msgs]
    assert [m.get("customType") or m["role"] for m in msgs] == [
        "compactionSummary", "user", "assistant", "branchSummary", "user"]
    assert "we did X" in msgs[0]["content"] and "tried Y" in msgs[3]["content"]
    assert user_texts_last_turns(p, 5) == ["kept", "new"]


def test_append_after_close_is_refused(tmp_path: Path) -> None:
    t = Transcript.open(tmp_path / "s.jsonl", cwd="/w")
    t.close()
    with pytest.raises(TranscriptError, match="is closed"):
        t.append_message(_user("late"))
    t.close()  # idempotent


def test_surrogates_are_repaired_not_fatal(tmp_path: Path) -> None:
    """A surrogate pair split across stream chunks (two lone halves) or a lone surrogate is still recorded."""
    t = Transcript.open(tmp_path / "s.jsonl", cwd="/w")
    t.append_message({"role": "user", "content": [{"type": "text", "text": "a \ud83d" + "\ude00 b \ud800"}],
                      "timestamp": 1})
    t.close()
    entries = read_transcript(tmp_path / "s.jsonl").entries
    assert entries[-1]["message"]["content"][0]["text"] == "a \U0001F600 b \ufffd"


def test_pi_bash_executions_and_summaries_read_as_pi_builds_them() -> None:
    """pi ``!cmd`` messages become pi's "Ran `cmd`" text (``!!`` ones stay out); summaries use pi's wording."""
    from legion.workers.transcript import context_messages, text_of

    def entry(i: int, parent: int | None, **kw: Any) -> dict[str, Any]:
        return {"id": f"e{i}", "parentId": f"e{parent}" if parent is not None else None, "timestamp": "t", **kw}

    bash = {"role": "bashExecution", "command": "ls", "output": "a\nb", "exitCode": 2, "cancelled": False,
            "truncated": True, "fullOutputPath": "/tmp/o.log", "timestamp": 1}
    hidden = {**bash, "command": "secret", "excludeFromContext": True}
    entries = [entry(0, None, type="message", message={"role": "user", "content": "hi", "timestamp": 1}),
               entry(1, 0, type="message", message=bash), entry(2, 1, type="message", message=hidden),
               entry(3, 2, type="branch_summary", fromId="e0", summary="tried X")]
    custom = {"role": "custom", "customType": "ext", "content": "from an extension", "display": True,
              "timestamp": 1}
    texts = [text_of(m) for m in context_messages([*entries[:3], entry(9, 2, type="message", message=custom)])]
    assert texts[-1] == "from an extension"
    texts = [text_of(m) for m in context_messages(entries)]
    assert texts == ["hi", "Ran `ls`\n```\na\nb\n```\n\nCommand exited with code 2\n\n"
                     "[Output truncated. Full output: /tmp/o.log]",
                     "The following is a summary of a branch that this conversation came back from:\n\n"
                     "<summary>\ntried X</summary>"]
    compacted = [*entries, entry(4, 3, type="compaction", summary="S", firstKeptEntryId="e3", tokensBefore=9)]
    assert text_of(context_messages(compacted)[0]) == (
        "The conversation history before this point was compacted into the following summary:\n\n"
        "<summary>\nS\n</summary>")


def _three_turns(p: Path) -> list[str]:
    """A 3-turn transcript (user/assistant ×3); returns its raw lines."""
    t = Transcript.open(p, cwd="/w", provider="scripted", model_id="x")
    for n in range(1, 4):
        t.append_message(_user(f"question {n}"))
        t.append_message(_assistant(f"answer {n}"))
    t.close()
    return p.read_bytes().decode().splitlines()


def _corrupt_line(p: Path, needle: str) -> int:
    """Flip one byte of the line holding ``needle`` so it is no longer JSON; returns its 1-based number."""
    lines = p.read_bytes().split(b"\n")
    n = next(i for i, line in enumerate(lines) if needle.encode() in line)
    lines[n] = lines[n][:-1] + b"#"  # the closing brace
    p.write_bytes(b"\n".join(lines))
    return n + 1


def test_a_corrupt_line_loses_only_itself(tmp_path: Path) -> None:
    """Corrupting the first user line drops that message alone; the reply after it stays in the context."""
    p = tmp_path / "s.jsonl"
    _three_turns(p)
    bad = _corrupt_line(p, "question 1")
    data = read_transcript(p)
    assert data.bad_lines == [bad] and len(data.reattached) == 1
    texts = [m["content"][0]["text"] for m in _context(data)]
    assert texts == ["answer 1", "question 2", "answer 2", "question 3", "answer 3"]


def _context(data: Any) -> list[dict[str, Any]]:
    return context_messages(data.leaf_path())


def test_opening_a_damaged_transcript_repairs_it_and_keeps_the_original(tmp_path: Path) -> None:
    p = tmp_path / "s.jsonl"
    _three_turns(p)
    bad = _corrupt_line(p, "question 2")
    damaged = p.read_bytes()
    t = Transcript.open(p, cwd="/w")
    assert t.repair is not None and t.repair.bad_lines == [bad] and t.repair.original.read_bytes() == damaged
    assert f"1 unreadable line(s) ({bad}) dropped, 1 entry re-attached" in t.repair.describe()
    t.append_message(_user("question 4"))
    t.close()
    check_pi_format(p)  # one clean linear branch again, as pi reads it
    texts = [m["content"][0]["text"] for m in _context(read_transcript(p))]
    assert texts == ["question 1", "answer 1", "answer 2", "question 3", "answer 3", "question 4"]
    again = Transcript.open(p, cwd="/w")  # a clean file is not touched again
    assert again.repair is None
    again.close()


def test_repair_header_rebuilds_a_damaged_or_missing_first_line(tmp_path: Path) -> None:
    from legion.workers.transcript import repair_header

    p = tmp_path / "s.jsonl"
    t = Transcript.open(p, cwd="/w")
    t.append_message({"role": "user", "content": "go", "timestamp": 1})
    t.close()
    header, rest = p.read_bytes().split(b"\n", 1)
    sid = json.loads(header)["id"]
    assert repair_header(p, cwd="/elsewhere") is None  # intact: untouched
    p.write_bytes(header[:-20] + b"\x00\xff" + b"\n" + rest)  # torn: the id is still readable in it
    repair = repair_header(p, cwd="/w")
    assert repair is not None and repair.dropped_first_line and repair.header["id"] == sid
    assert repair.original.read_bytes().startswith(header[:-20])
    reopened = Transcript.open(p, cwd="/x")
    assert reopened.header["id"] == sid and reopened.header["cwd"] == "/w"
    assert [m["content"] for m in reopened.messages()] == ["go"]
    reopened.close()
    p.write_bytes(rest)  # no header line at all: one is added, every entry kept
    repair = repair_header(p, cwd="/w")
    assert repair is not None and not repair.dropped_first_line
    assert read_transcript(p).header is not None
    assert len(read_transcript(p).entries) == len([line for line in rest.splitlines() if line.strip()])


def test_repair_header_refuses_what_it_cannot_repair(tmp_path: Path) -> None:
    from legion.workers.transcript import repair_header

    garbage = tmp_path / "g.jsonl"
    garbage.write_bytes(b"\x00" * 50 + b"\nnot json\n")
    with pytest.raises(TranscriptError, match="no readable entry"):
        repair_header(garbage, cwd="/w")
    assert garbage.read_bytes().startswith(b"\x00")  # left as it was
    with pytest.raises(TranscriptError, match="cannot read"):
        repair_header(tmp_path, cwd="/w")  # a directory
    empty = tmp_path / "e.jsonl"
    empty.write_bytes(b"")
    assert repair_header(empty, cwd="/w") is None
    assert repair_header(tmp_path / "never-created.jsonl", cwd="/w") is None  # a session that never started


def test_a_settle_sync_goes_through_the_writer_and_falls_back_to_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fsyncs: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real(fd))[1])
    t = Transcript.open(tmp_path / "s.jsonl", cwd=str(tmp_path))
    taken: list[Path] = []
    t.sync_through(lambda path: (taken.append(path), True)[1])
    t.sync()
    assert taken == [tmp_path / "s.jsonl"] and fsyncs == []  # the ledger writer syncs it with its batch
    t.sync()
    assert len(taken) == 1  # nothing written since: nothing to sync
    t.append_custom("note", {"n": 1})
    t.sync_through(lambda path: False)  # it cannot (its writer is closed): fsync in place
    t.close()
    assert len(fsyncs) == 1
    again = Transcript.open(tmp_path / "s.jsonl", cwd=str(tmp_path))  # what an earlier process wrote is synced
    again.sync_through(lambda path: (taken.append(path), True)[1])
    again.close()
    assert len(taken) == 2 and len(fsyncs) == 1
    never = Transcript.open(tmp_path / "n.jsonl", cwd=str(tmp_path), fsync=FsyncPolicy.NEVER)
    never.sync_through(lambda path: (taken.append(path), True)[1])
    never.close()
    assert len(taken) == 2 and len(fsyncs) == 1  # `never` asks nobody
