"""Parse one role card (markdown + YAML frontmatter) into an `AgentConfig`.

Anything wrong with the bytes, the YAML or a value is a `CardError` carrying `file:line`
(where YAML gives a position). Nothing else escapes `parse_card`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from legion.agents.errors import CardError, UnknownFieldError
from legion.agents.fields import CARD_SPEC, CENTURION, SLUG
from legion.agents.modelspec import Thinking
from legion.agents.phases import PhaseDeclaration
from legion.agents.schema import SchemaError

MAX_CARD_BYTES: Final = 256 * 1024
_MAX_LINE_NODES: Final = 20_000
LAYERS: Final = ("builtin", "user", "project")
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_YAML_FAILURES: Final = (yaml.YAMLError, ValueError, TypeError, OverflowError, RecursionError, AttributeError)


@dataclass(frozen=True)
class Criterion:
    description: str
    command: str | None = None
    required: bool = True
    evidence: str | None = None


@dataclass(frozen=True)
class Acceptance:
    level: str = "attested"
    role: str | None = None
    criteria: tuple[Criterion, ...] = ()


@dataclass(frozen=True)
class AgentConfig:
    """A validated role card: identity, prompt, context, tools, budgets, phases, acceptance."""

    name: str
    prompt: str
    source: str = "builtin"
    path: str = ""
    description: str = ""
    kind: str = "native"
    model: str | None = None
    thinking: Thinking = None
    aliases: tuple[str, ...] = ()
    preset: str | None = None
    team: str | None = None
    fallback_models: tuple[str, ...] = ()
    system_prompt_mode: str = "append"
    inherit_project_context: bool = True
    default_reads: tuple[str, ...] = ()
    tools: tuple[str, ...] | None = None
    timeout_ms: int | None = None
    tool_timeout_ms: int | None = None
    loop_notice_ms: int | None = None
    max_subagent_depth: int | None = None
    allow_nested_subagents: bool = False
    utility: bool = False
    disabled: bool = False
    worktree: bool = False
    worktree_downgraded: bool = False  # the card asked for a worktree but is not the centurion
    on_blocked: str = "ask"  # an extension's dialog: block and ask the parent, or reject it at once
    tool_budget: int | None = None
    turn_budget: int | None = None
    restart: str = "transient"
    max_restarts: int | None = None
    restart_period_ms: int | None = None
    phases: PhaseDeclaration | None = None
    acceptance: Acceptance | None = None
    budget: Mapping[str, Any] | None = None  # {reserveUsd}: what a launch holds of the run's cost budget
    explicit: frozenset[str] = frozenset()
    warnings: tuple[str, ...] = ()
    digest: str = ""
    lines: Mapping[str, int] = field(default_factory=dict, compare=False, repr=False)

    @property
    def is_centurion(self) -> bool:
        return self.name == CENTURION

    @property
    def read_only(self) -> bool:
        """`acceptance.role: read-only` (a bash discipline rule, not a sandbox)."""
        return self.acceptance is not None and self.acceptance.role == "read-only"

    def where(self, key: str | None = None) -> str:
        """`file:line` of a frontmatter key (or of the file)."""
        line = self.lines.get(key) if key else None
        return f"{self.path}:{line}" if line else self.path


_ATTR: Final = {
    "fallbackModels": "fallback_models",
    "systemPromptMode": "system_prompt_mode",
    "inheritProjectContext": "inherit_project_context",
    "defaultReads": "default_reads",
    "timeoutMs": "timeout_ms",
    "toolTimeoutMs": "tool_timeout_ms",
    "loopNoticeMs": "loop_notice_ms",
    "onBlocked": "on_blocked",
    "maxSubagentDepth": "max_subagent_depth",
    "allowNestedSubagents": "allow_nested_subagents",
    "toolBudget": "tool_budget",
    "turnBudget": "turn_budget",
    "maxRestarts": "max_restarts",
    "restartPeriodMs": "restart_period_ms",
}
_TUPLES: Final = ("aliases", "fallbackModels", "defaultReads", "tools")


def attr_name(key: str) -> str:
    """The `AgentConfig` attribute of a frontmatter key (`timeoutMs` → `timeout_ms`)."""
    return _ATTR.get(key, key)


def parse_card(data: bytes, *, path: str | Path, source: str = "project") -> AgentConfig:
    """Parse and validate one card file's bytes; raises `CardError` (and only that)."""
    where = str(path)
    if len(data) > MAX_CARD_BYTES:
        raise CardError(
            f"card is larger than the limit of {MAX_CARD_BYTES} bytes; move long material into "
            "defaultReads files",
            path=where,
            line=1,
        )
    text = _decode(data, where)
    front, body, body_line = _split(text, where)
    raw, lines = _load_yaml(front, where)
    values, problems = CARD_SPEC.check_each(raw, "")
    if problems:
        raise _schema_failure(problems, where, lines)
    return _build(values, body, where, source, lines, body_line, data)


def _schema_failure(problems: list[SchemaError], where: str, lines: Mapping[str, int]) -> CardError:
    """One error for every wrong key of the card (one line each), located at the first."""
    texts = [p.message if p.key else str(p) for p in problems]
    first = problems[0]
    kind = UnknownFieldError if all(p.key is not None for p in problems) else CardError
    if len(problems) == 1:
        return kind(texts[0], path=where, line=_line_for(first.path, lines))
    listed = "; ".join(f"line {_line_for(p.path, lines)}: {t}" for p, t in zip(problems, texts, strict=True))
    return kind(f"{len(problems)} problems in the frontmatter — {listed}", path=where,
                line=_line_for(first.path, lines))


def _decode(data: bytes, where: str) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise CardError(
            f"not valid UTF-8 (byte {exc.start}); save the card as UTF-8", path=where, line=line
        ) from None
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise CardError("contains a NUL character; a card is a text file", path=where, line=line)
    return text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")


def _split(text: str, where: str) -> tuple[str, str, int]:
    lines = text.split("\n")
    if not lines or lines[0].rstrip() != "---":
        raise CardError(
            "a card must start with a '---' line opening its YAML frontmatter", path=where, line=1
        )
    for n in range(1, len(lines)):
        if lines[n].rstrip() in ("---", "..."):
            return "\n".join(lines[1:n]), "\n".join(lines[n + 1 :]).strip("\n"), n + 2
    raise CardError("the YAML frontmatter is never closed: add a '---' line after it", path=where, line=1)


def _load_yaml(front: str, where: str) -> tuple[Any, dict[str, int]]:
    loader = _Loader(front)
    node: Any = None
    try:
        node = loader.get_single_node()
        raw = loader.construct_document(node) if node is not None else None
    except _YAML_FAILURES as exc:
        problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
        raise CardError(
            f"invalid YAML frontmatter: {problem}", path=where, line=_yaml_error_line(exc, front, node)
        ) from None
    finally:
        loader.dispose()
    duplicate = _first_duplicate_key(node)
    if duplicate is not None:
        key, line = duplicate
        raise CardError(f"duplicate key '{key}' in the frontmatter; keep one", path=where, line=line)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise CardError(
            f"the frontmatter must be a YAML mapping of keys to values (got a {type(raw).__name__})",
            path=where,
            line=2,
        )
    lines: dict[str, int] = {}
    _collect_lines(node, "", lines)
    return raw, lines


def _first_duplicate_key(node: Any) -> tuple[str, int] | None:
    """The first mapping key given twice (YAML would keep the last silently) and its second line;
    each node is visited once, so alias bombs stay linear."""
    seen: set[int] = set()
    stack = [node]
    while stack and len(seen) <= _MAX_LINE_NODES:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, yaml.MappingNode):
            keys: set[tuple[str, str]] = set()
            for key_node, value_node in current.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                    ident = (key_node.tag, key_node.value)
                    if ident in keys:
                        return str(key_node.value), int(key_node.start_mark.line) + 2
                    keys.add(ident)
                stack.append(value_node)
        elif isinstance(current, yaml.SequenceNode):
            stack.extend(current.value)
    return None


def _yaml_error_line(exc: BaseException, front: str, node: Any) -> int:
    """The file line of a YAML failure: its mark, its reader position, or the key whose value failed."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is not None:
        return int(mark.line) + 2
    if isinstance(exc, yaml.reader.ReaderError):
        return front[: exc.position].count("\n") + 2
    if isinstance(node, yaml.MappingNode):
        # a constructor failed without a position (e.g. `!!timestamp 2001-13-45`): find the key
        for key_node, value_node in node.value:
            probe = _Loader("")
            try:
                probe.construct_object(value_node, deep=True)
            except _YAML_FAILURES:
                return int(key_node.start_mark.line) + 2
            finally:
                probe.dispose()
    return 2


def _collect_lines(node: Any, prefix: str, out: dict[str, int], seen: set[int] | None = None) -> None:
    """Map dotted keys to file lines; each node is visited once, so alias bombs stay linear."""
    seen = set() if seen is None else seen
    if node is None or id(node) in seen or len(seen) > _MAX_LINE_NODES:
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = str(getattr(key_node, "value", ""))
            dotted = f"{prefix}.{key}" if prefix else key
            out.setdefault(dotted, key_node.start_mark.line + 2)
            _collect_lines(value_node, dotted, out, seen)
    elif isinstance(node, yaml.SequenceNode):
        for n, item in enumerate(node.value):
            dotted = f"{prefix}[{n}]"
            out.setdefault(dotted, item.start_mark.line + 2)
            _collect_lines(item, dotted, out, seen)


def _line_for(dotted: str, lines: Mapping[str, int]) -> int:
    """The line of the closest enclosing key of a dotted path; the frontmatter's first line if none."""
    probe = dotted
    while probe:
        if probe in lines:
            return lines[probe]
        cut = max(probe.rfind("."), probe.rfind("["))
        probe = probe[:cut] if cut > 0 else ""
    return 2


def _build(
    values: dict[str, Any],
    body: str,
    where: str,
    source: str,
    lines: dict[str, int],
    body_line: int,
    data: bytes,
) -> AgentConfig:
    name = values.get("name") or _name_from_path(where)
    warnings: list[str] = []
    downgraded = bool(values.get("worktree")) and name != CENTURION
    if downgraded:
        values["worktree"] = False
        warnings.append(
            f"{where}:{lines.get('worktree', '?')}: worktree: true is reserved for the centurion; "
            f"'{name}' runs without a worktree and shares its parent's checkout (set worktree: false)"
        )
    if values.get("phases") is not None and name != CENTURION:
        warnings.append(
            f"{where}:{lines.get('phases', '?')}: phases apply only to the centurion (G3); "
            f"'{name}' runs without a phase machine (remove 'phases')"
        )
    warnings += _tool_contradictions(values, name, where, lines)
    if values.get("systemPromptMode") == "replace" and not body.strip():
        raise CardError(
            "systemPromptMode: replace needs a prompt body after the frontmatter", path=where, line=body_line
        )
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key == "name":
            continue
        if key == "acceptance":
            value = _acceptance(value)
        elif key in _TUPLES:
            value = tuple(value)
        kwargs[attr_name(key)] = value
    aliases = kwargs.get("aliases", ())
    if name in aliases:
        raise CardError(f"aliases: '{name}' is the card's own name", path=where, line=lines.get("aliases"))
    return AgentConfig(
        name=name,
        prompt=body,
        source=source,
        path=where,
        explicit=frozenset(values),
        worktree_downgraded=downgraded,
        warnings=tuple(warnings),
        digest=hashlib.sha256(data).hexdigest()[:16],
        lines=lines,
        **kwargs,
    )


_WRITE_TOOLS: Final = ("write", "edit")
_DISPATCH_TOOLS: Final = ("subagent", "vexillatio")


def _tool_contradictions(
    values: Mapping[str, Any], name: str, where: str, lines: Mapping[str, int]
) -> list[str]:
    """Warnings (never errors) for tool lists that contradict the card's own read-only/leaf flags."""
    tools = values.get("tools")
    if tools is None:
        return []
    at = f"{where}:{lines.get('tools', '?')}"
    out = []
    dispatch = [t for t in tools if t in _DISPATCH_TOOLS]
    if values.get("utility") and dispatch:
        out.append(
            f"{at}: '{name}' is a utility agent, always a leaf: {', '.join(dispatch)} cannot dispatch "
            "anything from it (remove them from tools)"
        )
    writes = [t for t in tools if t in _WRITE_TOOLS]
    if (values.get("acceptance") or {}).get("role") == "read-only" and writes:
        out.append(
            f"{at}: acceptance.role read-only only restrains bash; '{name}' can still change files with "
            f"{', '.join(writes)} (remove them from tools to make it read-only)"
        )
    return out


def _name_from_path(where: str) -> str:
    stem = Path(where).stem
    if not SLUG.fullmatch(stem):
        raise CardError(
            f"the card has no 'name:' and its file name '{stem}' is not a valid role name; add 'name: <slug>'",
            path=where,
            line=2,
        )
    return stem


def _acceptance(value: dict[str, Any]) -> Acceptance:
    criteria = tuple(
        Criterion(description=c)
        if isinstance(c, str)
        else Criterion(
            description=c["description"],
            command=c.get("command"),
            required=c.get("required", True),
            evidence=c.get("evidence"),
        )
        for c in value.get("criteria", [])
    )
    return Acceptance(level=value.get("level", "attested"), role=value.get("role"), criteria=criteria)
