"""Tools through run_tool: validation, file tools, bash process groups, timeouts, truncation, legion tools."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from legion.workers.context import SessionContext
from legion.workers.tools.base import ToolContext, run_tool
from legion.workers.tools.bash import MAX_BYTES, MAX_LINES, _Capture
from legion.workers.tools.catalog import all_tools, select_tools
from legion.workers.tools.legion_tools import SUBAGENT_ACTIONS
from legion.workers.tools.schema import validate

TOOLS = all_tools()


def ctx_for(tmp_path: Path, **kw: Any) -> ToolContext:
    return ToolContext(SessionContext(node_id="n1", cwd=str(tmp_path), **kw), tmp_path / "out")


async def call(name: str, args: Any, ctx: ToolContext) -> tuple[str, bool]:
    r = await run_tool(TOOLS[name], args, ctx)
    return r.text, r.is_error


def test_schema_validator_messages() -> None:
    schema = TOOLS["read"].parameters
    assert validate({"path": "a"}, schema) == []
    assert validate({}, schema) == ["arguments.path: required parameter is missing"]
    assert validate({"path": 3}, schema) == ["arguments.path: expected string, got integer"]
    assert validate({"path": "a", "offset": 0}, schema) == ["arguments.offset: must be >= 1, got 0"]
    assert "unknown parameter" in validate({"path": "a", "bogus": 1}, schema)[0]
    assert validate({"path": "a", "limit": True}, schema) == ["arguments.limit: expected integer, got boolean"]
    assert validate({"action": "nope"}, TOOLS["subagent"].parameters)[0].startswith("arguments.action: must be one")
    assert validate({"tasks": [{"task": ""}]}, TOOLS["vexillatio"].parameters) == [
        "arguments.tasks[0].task: must be at least 1 characters"]


def test_schema_validator_lists_every_problem_in_document_order_with_a_suggestion() -> None:
    read = TOOLS["read"].parameters
    assert validate({"offst": 3, "limit": 0}, read) == [
        "arguments.path: required parameter is missing",
        "arguments.offst: unknown parameter; allowed: limit, offset, path; did you mean 'offset'?",
        "arguments.limit: must be >= 1, got 0",
    ]
    assert validate({"path": "a", "limit": 5.0}, read) == []  # an integral float is a JSON Schema integer
    assert validate({"path": float("inf")}, read) == ["arguments.path: expected string, got inf"]
    vex = TOOLS["vexillatio"].parameters
    assert validate({"tasks": [{"model": "x"}, 5]}, vex) == [
        "arguments.tasks[0].task: required parameter is missing",
        "arguments.tasks[1]: expected object, got integer",
    ]


def test_select_tools_unknown() -> None:
    with pytest.raises(ValueError, match="unknown tool"):
        select_tools(["read", "fly"])
    assert len(SUBAGENT_ACTIONS) == 13


async def test_invalid_arguments_are_tool_errors(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    text, err = await call("read", "not a dict", ctx)
    assert err and "must be a JSON object" in text
    text, err = await call("edit", {"path": "x"}, ctx)
    assert err and "oldText: required" in text


async def test_read_write_edit(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    text, err = await call("write", {"path": "d/f.txt", "content": "alpha\nbeta\nbeta\ngamma\n"}, ctx)
    assert not err and (tmp_path / "d/f.txt").exists()
    text, err = await call("read", {"path": "d/f.txt", "offset": 2, "limit": 2}, ctx)
    assert text.splitlines() == ["     2\tbeta", "     3\tbeta", "[1 more lines; continue with offset=4]"]
    text, err = await call("edit", {"path": "d/f.txt", "oldText": "beta", "newText": "B"}, ctx)
    assert err and "occurs 2 times" in text
    text, err = await call("edit", {"path": "d/f.txt", "oldText": "delta", "newText": "B"}, ctx)
    assert err and "was not found" in text
    text, err = await call("edit", {"path": "d/f.txt", "oldText": "gamma", "newText": "G"}, ctx)
    assert not err and "line 4" in text
    assert (tmp_path / "d/f.txt").read_text().endswith("G\n")
    text, err = await call("read", {"path": "missing"}, ctx)
    assert err and "does not exist" in text
    (tmp_path / "bin").write_bytes(b"\x00\x01")
    text, err = await call("read", {"path": "bin"}, ctx)
    assert err and "binary" in text


async def test_ls_find_grep(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    (tmp_path / "src/pkg").mkdir(parents=True)
    (tmp_path / "src/pkg/a.py").write_text("import os\nVALUE = 1\n")
    (tmp_path / "src/b.py").write_text("value = 2\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git/config").write_text("VALUE\n")
    (tmp_path / "legion.db").write_text("VALUE secret\n")
    text, _ = await call("ls", {"path": "src"}, ctx)
    assert text.splitlines() == ["b.py", "pkg/"]
    text, _ = await call("find", {"pattern": "*.py"}, ctx)
    assert sorted(text.splitlines()) == ["src/b.py", "src/pkg/a.py"]
    text, _ = await call("find", {"pattern": "src/pkg/*.py"}, ctx)
    assert text.splitlines() == ["src/pkg/a.py"]
    text, _ = await call("grep", {"pattern": "value", "ignoreCase": True}, ctx)
    assert sorted(text.splitlines()) == ["src/b.py:1: value = 2", "src/pkg/a.py:2: VALUE = 1"]
    text, err = await call("grep", {"pattern": "(", "path": "src"}, ctx)
    assert err and "invalid regular expression" in text
    text, err = await call("grep", {"pattern": "(", "literal": True}, ctx)
    assert not err and text == "no matches"


async def test_bash_truncates_and_keeps_full_output(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    text, err = await call("bash", {"command": f"seq 1 {MAX_LINES + 500}"}, ctx)
    assert not err and text.startswith("[output truncated")
    full = text.split("full output: ")[1].split("]")[0]
    assert Path(full).read_text().splitlines()[0] == "1"
    assert text.splitlines()[-1] == str(MAX_LINES + 500)
    text, err = await call("bash", {"command": "head -c 3000000 /dev/zero | tr '\\0' 'a'; echo; echo END"}, ctx)
    assert text.splitlines()[-1] == "END" and len(text) < 60 * 1024
    full = text.split("full output: ")[1].split("]")[0]
    assert Path(full).stat().st_size > 3_000_000


async def test_legion_tools_without_and_with_requester(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    text, err = await call("legion_mail", {"to": "parent", "subject": "s", "body": "b"}, ctx)
    assert err and "no connection to the root" in text
    seen: list[tuple[str, dict[str, Any], str]] = []

    async def requester(tool: str, args: dict[str, Any], session: SessionContext) -> dict[str, Any]:
        seen.append((tool, args, session.node_id))
        return {"ok": True, "text": "sent #7"}

    ctx.requester = requester
    text, err = await call("legion_mail", {"to": "parent", "subject": "s", "body": "b"}, ctx)
    assert (text, err) == ("sent #7", False)
    assert seen == [("legion_mail", {"to": "parent", "subject": "s", "body": "b"}, "n1")]
    text, err = await call("subagent", {"action": "launch", "agnet": "x"}, ctx)
    assert err and "agnet: unknown parameter" in text


def test_legion_tool_registration_rules() -> None:
    from legion.workers.tools.catalog import legion_tool_names

    assert legion_tool_names(is_root=True) == ["subagent", "vexillatio"]
    assert legion_tool_names(is_root=True, enabled=False) == []
    assert legion_tool_names(is_root=False) == ["legion_mail", "legion_tree"]
    assert legion_tool_names(is_root=False, has_phase_machine=True, allow_nested=True) == [
        "legion_mail", "legion_tree", "legion_phase", "subagent", "vexillatio"]
    assert "vexillatio" not in legion_tool_names(is_root=False, allow_nested=True, utility=True)
    assert set(legion_tool_names(is_root=False, has_phase_machine=True, allow_nested=True)) <= set(TOOLS)


async def test_os_errors_name_the_file(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    (tmp_path / "dir").mkdir()
    text, err = await call("write", {"path": "dir", "content": "x"}, ctx)
    assert err and text == f"write: Is a directory ({tmp_path / 'dir'})"


async def test_legion_tool_reply_is_capped(tmp_path: Path) -> None:
    from legion.workers.tools.legion_tools import MAX_REPLY_CHARS

    async def requester(tool: str, args: dict[str, Any], session: SessionContext) -> dict[str, Any]:
        return {"ok": True, "text": "x" * (MAX_REPLY_CHARS + 10)}

    ctx = ctx_for(tmp_path)
    ctx.requester = requester
    text, err = await call("legion_tree", {}, ctx)
    assert not err and len(text) < MAX_REPLY_CHARS + 100 and text.endswith("ask for less]")


async def test_read_streams_huge_lines_and_bad_encoding(tmp_path: Path) -> None:
    """A giant line is shown truncated (the file is never read whole); numbering, CRLF and bad UTF-8 hold."""
    ctx = ctx_for(tmp_path)
    with (tmp_path / "big.log").open("wb") as f:
        f.write(b"first\r\n")
        f.write(b"x" * (3 * 2**20) + b"\n")  # one 3 MiB line
        f.write(b"caf\xe9 latin-1\n")
        f.writelines(b"line %d\n" % i for i in range(4, 10_001))
    text, err = await call("read", {"path": "big.log", "limit": 3}, ctx)
    assert not err and len(text) < 100_000
    rows = text.splitlines()
    assert rows[0] == "     1\tfirst" and rows[1].startswith("     2\txxxx") and rows[1].endswith("[line truncated]")
    assert rows[2] == "     3\tcaf\ufffd latin-1" and rows[3] == "[9997 more lines; continue with offset=4]"
    text, err = await call("read", {"path": "big.log", "offset": 9_999}, ctx)
    assert not err and text.splitlines() == ["  9999\tline 9999", " 10000\tline 10000"]
    text, err = await call("read", {"path": "big.log", "offset": 10_001}, ctx)
    assert err and "beyond the end" in text and "10000 lines" in text


async def test_bash_giant_single_line_shows_its_tail(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    text, err = await call("bash", {"command": "yes x | head -c 600000 | tr -d '\\n'; printf END"}, ctx)
    assert not err and text.endswith("xxxEND") and "showing the last 51200 characters" in text
    full = text.split("full output: ", 1)[1].split("]", 1)[0]
    assert Path(full).stat().st_size == 300_003


@pytest.mark.parametrize("chunk", [MAX_BYTES // 3, 65536, 2 * MAX_BYTES + 1, 6 * MAX_BYTES])
def test_a_giant_line_reads_the_same_however_the_pipe_chunked_it(tmp_path: Path, chunk: int) -> None:
    """Under load the pipe hands over bigger chunks; the capture may then cut the line to exactly MAX_BYTES."""
    data = b"x" * (6 * MAX_BYTES) + b"END"
    cap = _Capture(tmp_path)
    for i in range(0, len(data), chunk):
        cap.feed(data[i:i + chunk])
    text, truncated = cap.result_text()
    cap.close()
    head, body = text.split("\n", 1)
    assert truncated and f"showing the last {MAX_BYTES} characters of {len(data)} bytes" in head
    assert body == data[-MAX_BYTES:].decode()


async def test_integral_float_arguments_are_integers(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    for name in ("a", "b", "c"):
        (tmp_path / name).write_text("1\n2\n3\n")
    text, err = await call("ls", {"limit": 2.0}, ctx)
    assert not err and text.splitlines()[:2] == ["a", "b"]
    text, err = await call("read", {"path": "a", "offset": 2.0, "limit": 1.0}, ctx)
    assert not err and text.splitlines() == ["     2\t2", "[1 more lines; continue with offset=3]"]
    text, err = await call("ls", {"limit": 2.5}, ctx)
    assert err and "expected integer" in text


async def test_invalid_unicode_content_is_a_readable_error(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    text, err = await call("write", {"path": "f.txt", "content": "bad \ud800 surrogate"}, ctx)
    assert err and "not valid Unicode" in text and "internal error" not in text
    assert not (tmp_path / "f.txt").exists()


async def test_grep_streams_huge_files_with_true_line_numbers(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    with (tmp_path / "big.txt").open("wb") as f:
        f.write(b"a" * (3 * 2**20 + 1000) + b" NEEDLE-far\n")  # the match sits 3 MiB into one line
        f.write(b"plain\r\n")
        f.writelines(b"row %d\n" % i for i in range(3, 50_000))
        f.write(b"last NEEDLE-end")
    text, err = await call("grep", {"pattern": "NEEDLE-\\w+"}, ctx)
    assert not err
    rows = text.splitlines()
    assert len(rows) == 2 and rows[0].startswith("big.txt:1: ") and "NEEDLE-far" in rows[0]
    assert rows[1] == "big.txt:50000: last NEEDLE-end"
    text, _ = await call("grep", {"pattern": "^plain$"}, ctx)
    assert text == "big.txt:2: plain"


async def test_edit_keeps_the_rest_of_a_non_utf8_file_byte_exact(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    (tmp_path / "legacy.txt").write_bytes(b"caf\xe9 cr\xe8me\r\nline two\r\n\xff end\n")
    text, err = await call("edit", {"path": "legacy.txt", "oldText": "line two", "newText": "line 2"}, ctx)
    assert not err and "line 2" in text
    assert (tmp_path / "legacy.txt").read_bytes() == b"caf\xe9 cr\xe8me\r\nline 2\r\n\xff end\n"


async def test_edit_matches_and_keeps_crlf_line_endings(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    (tmp_path / "win.txt").write_bytes(b"one\r\ntwo\r\nthree\r\n")
    text, err = await call("edit", {"path": "win.txt", "oldText": "one\ntwo", "newText": "1\n2\n2b"}, ctx)
    assert not err and "line 1" in text
    assert (tmp_path / "win.txt").read_bytes() == b"1\r\n2\r\n2b\r\nthree\r\n"


async def test_find_double_star_matches_zero_directories(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    (tmp_path / "src/a/b").mkdir(parents=True)
    for rel in ("src/test_top.py", "src/a/b/test_deep.py", "src/a/other.py"):
        (tmp_path / rel).write_text("")
    text, err = await call("find", {"pattern": "src/**/test_*.py"}, ctx)
    assert not err and sorted(text.splitlines()) == ["src/a/b/test_deep.py", "src/test_top.py"]


# ---- the session's tool executor: file-tool work in a helper process it can kill --------------------------


