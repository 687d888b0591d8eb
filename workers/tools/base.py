"""Tool protocol shared by the built-in and legion tools.

A tool has a name, a description, a JSON-schema for its parameters and an async ``execute``.
``run_tool`` validates arguments first and turns every failure (bad arguments, ``ToolFailure``, any
unexpected exception) into an error result the model can read — a tool never raises into the loop.
"""

from __future__ import annotations

import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from legion.workers.context import SessionContext
from legion.workers.tools.executor import ToolExecutor
from legion.workers.tools.fileops import ToolFailure
from legion.workers.tools.schema import Schema, validate

__all__ = ["LegionRequester", "Tool", "ToolContext", "ToolFailure", "ToolResult", "run_tool", "spec"]

# (tool name, arguments, session context) -> {"ok": bool, "text": str, "details": Any}
LegionRequester = Callable[[str, dict[str, Any], SessionContext], Awaitable[dict[str, Any]]]


@dataclass
class ToolResult:
    text: str
    is_error: bool = False
    details: dict[str, Any] | None = None


@dataclass
class ToolContext:
    """What a tool may use: the session's context, a place for spilled output, process-group bookkeeping,
    and the session's own executor for work that may spin or block (``executor``)."""

    session: SessionContext
    output_dir: Path
    requester: LegionRequester | None = None
    pgids: set[int] = field(default_factory=set)
    executor: ToolExecutor = field(default_factory=ToolExecutor)

    @property
    def cwd(self) -> str:
        return self.session.cwd

    def resolve(self, path: str) -> Path:
        p = Path(path).expanduser()
        return p if p.is_absolute() else Path(self.session.cwd) / p


class Tool(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def parameters(self) -> Schema: ...

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult: ...


def spec(tool: Tool) -> dict[str, Any]:
    """The provider-facing description of a tool."""
    return {"name": tool.name, "description": tool.description, "parameters": tool.parameters}


async def run_tool(tool: Tool, args: Any, ctx: ToolContext) -> ToolResult:
    """Validate and execute; every failure becomes an error result naming the tool."""
    if not isinstance(args, dict):
        return ToolResult(f"{tool.name}: arguments must be a JSON object, got {type(args).__name__}", True)
    problems = validate(args, tool.parameters)
    if problems:
        return ToolResult(f"{tool.name}: invalid arguments — " + "; ".join(problems), True)
    args = _integers(args, tool.parameters)
    try:
        return await tool.execute(args, ctx)
    except ToolFailure as exc:
        return ToolResult(f"{tool.name}: {exc}", True)
    except UnicodeEncodeError as exc:  # e.g. an unpaired surrogate from a JSON "\ud800" escape
        return ToolResult(f"{tool.name}: the text is not valid Unicode ({exc.reason} at character {exc.start}); "
                          "send plain UTF-8 text", True)
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        return ToolResult(f"{tool.name}: {exc.strerror or exc}{where}", True)
    except Exception as exc:  # a tool bug must not crash the session
        tb = traceback.format_exception_only(type(exc), exc)[-1].strip()
        return ToolResult(f"{tool.name}: internal error: {tb}", True)


def _integers(args: dict[str, Any], schema: Schema) -> dict[str, Any]:
    """Integer parameters sent as integral floats (``5.0``, valid JSON-schema integers) become ints."""
    props = schema.get("properties", {})
    return {k: int(v) if isinstance(v, float) and props.get(k, {}).get("type") == "integer" else v
            for k, v in args.items()}
