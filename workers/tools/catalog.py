"""The tool catalog: every built-in and legion tool by name, and the default set for a session."""

from __future__ import annotations

from collections.abc import Iterable

from legion.workers.tools.base import Tool
from legion.workers.tools.bash import BashTool
from legion.workers.tools.files import EditTool, FindTool, GrepTool, LsTool, ReadTool, WriteTool
from legion.workers.tools.legion_tools import LEGION_TOOLS, legion_tools

BUILTIN_TOOLS = ("read", "bash", "edit", "write", "ls", "find", "grep")
DEFAULT_TOOLS = ("read", "bash", "edit", "write")
__all__ = ["BUILTIN_TOOLS", "DEFAULT_TOOLS", "LEGION_TOOLS", "all_tools", "legion_tool_names", "select_tools"]


def all_tools() -> dict[str, Tool]:
    tools: dict[str, Tool] = {t.name: t for t in (ReadTool(), BashTool(), EditTool(), WriteTool(), LsTool(),
                                                   FindTool(), GrepTool())}
    tools.update(legion_tools())
    return tools


_ALL = all_tools()


def select_tools(names: Iterable[str] | None = None) -> dict[str, Tool]:
    """Tools by name (default: all built-in tools); raise ValueError naming unknown tools and the legal set."""
    wanted = list(BUILTIN_TOOLS if names is None else names)
    unknown = [n for n in wanted if n not in _ALL]
    if unknown:
        raise ValueError(f"unknown tool(s) {', '.join(unknown)}; known tools: {', '.join(sorted(_ALL))}")
    return {n: _ALL[n] for n in wanted}


def legion_tool_names(*, is_root: bool, utility: bool = False, allow_nested: bool = False,
                      has_phase_machine: bool = False, enabled: bool = True) -> list[str]:
    """Which legion tools a session gets (docs/spec-conformance.md §2.2, §2.6, §5.9; registration is the gate).

    The root gets ``subagent`` and ``vexillatio`` (when ``enabled``); children get ``legion_mail`` and
    ``legion_tree``, ``legion_phase`` only with a declared phase machine, and the launch tools only
    when nesting is allowed — never in a utility child, which is always a leaf.
    """
    launch = ["subagent", "vexillatio"] if enabled else []
    if is_root:
        return launch
    names = ["legion_mail", "legion_tree"]
    if has_phase_machine:
        names.append("legion_phase")
    if allow_nested and not utility:
        names += launch
    return names
