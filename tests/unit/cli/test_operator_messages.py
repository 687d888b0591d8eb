"""What an operator verb says when the run refuses or does not answer: a busy root is not called dead."""

from __future__ import annotations

from pathlib import Path

import pytest

from legion.bus.control import RemoteError, RequestTimeout
from legion.bus.protocol import Message
from legion.cli.operate import EXIT_REFUSED, EXIT_USAGE, ArgError, failure_exit, text_arg, unanswered
from legion.reports.views import printable


def test_an_overloaded_root_is_reported_alive_and_busy() -> None:
    detail = "operator is alive but busy: 32 requests in flight from your client (operator-1), at most 32 per client"
    exc = RemoteError(Message("error", "operator", {"reason": "overload", "detail": detail}, "c1"))
    text = unanswered(exc)
    assert "alive but refused" in text and detail in text and "is its root alive" not in text
    assert "`legion stop`, `legion abort` and `legion status` are always answered" in text
    assert failure_exit(exc) == EXIT_REFUSED


def test_no_answer_at_all_still_asks_whether_the_root_is_alive() -> None:
    exc = RequestTimeout("no reply to 'request' to the root within 30s")
    assert "did not answer" in unanswered(exc) and "is its root alive?" in unanswered(exc)
    assert failure_exit(exc) == EXIT_USAGE


def test_text_args_must_be_utf8(tmp_path: Path) -> None:
    (tmp_path / "t.txt").write_bytes("añb".encode("latin-1"))
    with pytest.raises(ArgError, match=r"t\.txt is not UTF-8 text: byte 0xf1 at offset 1"):
        text_arg("@t.txt", tmp_path, "task")
    with pytest.raises(ArgError, match=r"the body is not valid UTF-8: byte 0xff at offset 3"):
        text_arg("abc\udcff", tmp_path, "body")
    assert text_arg("@plain", tmp_path, "subject", files=False) == "@plain"


def test_printable_escapes_controls_and_keeps_lines_on_request() -> None:
    assert printable("a\nb\x1b[31m\u202e\x07") == "a\\nb\\x1b[31m\\u202e\\x07"
    assert printable("a\nb\t\x1b[2J", lines=True) == "a\nb\t\\x1b[2J"
    assert printable(None) == "None" and printable("plain · ünïcode") == "plain · ünïcode"
