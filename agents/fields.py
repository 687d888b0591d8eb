"""The strict role-card field table (docs/spec-conformance.md §1.1 adapted to legion, docs/architecture.md §9.2)."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any, Final

from legion.agents.modelspec import check_model_string, check_thinking
from legion.agents.phases import validate_phases
from legion.agents.schema import (
    Bool,
    Custom,
    Either,
    Int,
    ListOf,
    Num,
    Obj,
    SchemaError,
    Spec,
    Str,
    describe,
    reference,
)

SLUG: Final = re.compile(r"[a-z][a-z0-9_-]{0,31}")
SLUG_HINT: Final = "[a-z][a-z0-9_-]{0,31} (lower-case letter first, at most 32 characters)"
KINDS: Final = ("native", "pi")
RESTART_TYPES: Final = ("permanent", "transient", "temporary")
# what happens when the role's run waits on an extension's dialog (docs/spec-conformance.md §2.1, blocked):
# `ask` blocks the node and asks its parent, `reject` answers "no" (cancels the dialog) at once
ON_BLOCKED_POLICIES: Final = ("ask", "reject")
SYSTEM_PROMPT_MODES: Final = ("append", "replace")
ACCEPTANCE_LEVELS: Final = ("attested", "verified")
ACCEPTANCE_ROLES: Final = ("read-only", "writer")
KNOWN_TOOLS: Final = (
    "bash",
    "read",
    "write",
    "edit",
    "ls",
    "find",
    "grep",
    "subagent",
    "vexillatio",
    "legion_mail",
    "legion_tree",
    "legion_phase",
)
CENTURION: Final = "centurion"

_slug = Str(pattern=SLUG, pattern_hint=SLUG_HINT)
_ms = Int(minimum=1, maximum=7 * 24 * 3600 * 1000, unit="ms")
_budget = Int(minimum=1, maximum=100_000)

_CRITERION_OBJ = Obj(
    {
        "description": Str(),
        "command": Str(),
        "required": Bool(),
        "evidence": Str(),
    },
    what="an acceptance criterion",
    required=("description",),
)
ACCEPTANCE: Final = Obj(
    {
        "level": Str(choices=ACCEPTANCE_LEVELS),
        "role": Str(choices=ACCEPTANCE_ROLES),
        "criteria": ListOf(
            Either(
                ((lambda v: isinstance(v, str), Str()), (lambda v: isinstance(v, dict), _CRITERION_OBJ)),
                expected="a criterion string or an object {description, command, required, evidence}",
            )
        ),
    },
    what="acceptance",
)


def _relative_path(value: str, path: str) -> str:
    """A `defaultReads` entry: a path inside the working directory (a card may come from a cloned repo)."""
    parts = PurePosixPath(value).parts
    if value.startswith(("/", "~")) or ".." in parts or "\\" in value:
        raise SchemaError(
            path,
            f"must be a path relative to the working directory, without '..' (got {describe(value)}); "
            "files outside the checkout are never read into a prompt",
        )
    return value


def _phases(value: Any, path: str) -> Any:
    return validate_phases(value, path)


FIELD_GROUPS: Final[dict[str, dict[str, Spec]]] = {
    "identity": {
        "name": _slug,
        "description": Str(nonempty=False),
        "kind": Str(choices=KINDS),
        "model": Str(validate=check_model_string),
        "thinking": Custom(check_thinking),
        "aliases": ListOf(_slug, unique=True, allow_csv=True),
        "preset": Str(),
        "team": _slug,
        "fallbackModels": ListOf(Str(validate=check_model_string), unique=True, allow_csv=True),
    },
    "context": {
        "systemPromptMode": Str(choices=SYSTEM_PROMPT_MODES),
        "inheritProjectContext": Bool(),
        "defaultReads": ListOf(Str(validate=_relative_path), unique=True, allow_csv=True),
    },
    "tools": {
        "tools": ListOf(Str(choices=KNOWN_TOOLS), unique=True, allow_csv=True),
    },
    "budget": {
        "timeoutMs": _ms,
        "toolTimeoutMs": _ms,
        "loopNoticeMs": Int(minimum=0, maximum=7 * 24 * 3600 * 1000, unit="ms (0: no long-running stall notices)"),
        "maxSubagentDepth": Int(minimum=1, maximum=16),
        "allowNestedSubagents": Bool(),
        "utility": Bool(),
        "disabled": Bool(),
        "worktree": Bool(),
        "onBlocked": Str(choices=ON_BLOCKED_POLICIES),
        "toolBudget": _budget,
        "turnBudget": _budget,
        # the share of the run's tree-wide cost budget a launch of this role holds until it settles
        "budget": Obj({"reserveUsd": Num(minimum=0)}, what="budget"),
    },
    "supervision": {
        "restart": Str(choices=RESTART_TYPES),
        "maxRestarts": Int(minimum=0, maximum=1000),
        "restartPeriodMs": _ms,
    },
    "phases": {"phases": Custom(_phases)},
    "acceptance": {"acceptance": ACCEPTANCE},
}

CARD_FIELDS: Final[dict[str, Spec]] = {k: v for group in FIELD_GROUPS.values() for k, v in group.items()}

FORBIDDEN_FIELDS: Final = {
    "spawnMode": (
        "'spawnMode' is not a card field: the backend is derived at launch (a centurion with a "
        "worktree runs as an rpc worker, everything else in the inprocess pool; settings "
        "`supervision.forceRpc` forces rpc for all). Remove the key"
    ),
    "placement": (
        "'placement' is not a card field: it was an old terminal pane-layout hint and has no "
        "meaning in legion. Remove the key"
    ),
}

CARD_SPEC: Final = Obj(CARD_FIELDS, what="card frontmatter", forbidden=FORBIDDEN_FIELDS)


def card_reference() -> list[tuple[str, str, Any]]:
    """Every card frontmatter key: (dotted path, accepted type, default=None)."""
    return reference(CARD_SPEC)
