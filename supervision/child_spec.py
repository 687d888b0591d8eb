"""Child specs, exit reasons and the child-handle protocol of the OTP layer (docs/architecture.md §3).

A child is anything that can be started by an async factory and then watched and stopped through a
`ChildHandle`: an `rpc` worker process, an in-pool session, or a nested `Supervisor` (a team).

Interface notes:
- `ChildSpec.restart` defaults to ``"transient"`` (agent sessions, docs/architecture.md §3), not OTP's
  ``permanent``.
- `shutdown` is either `RetireTimeouts` (`legion.procs`: the graceful retire-ladder timeouts,
  docs/architecture.md §3 "Retire ladder") or the string ``"brutal_kill"`` (skip the graceful step, as
  `stop --force`).
- A `significant` child must be transient or temporary (OTP rejects significant permanent children).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, Protocol, TypeAlias, runtime_checkable

from legion.procs import RetireTimeouts

RestartType = Literal["permanent", "transient", "temporary"]
MAX_DETAIL = 2000  # characters of a detail text kept in an event, a failure record or a reply
RESTART_TYPES: tuple[RestartType, ...] = ("permanent", "transient", "temporary")
BRUTAL_KILL: Literal["brutal_kill"] = "brutal_kill"
_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@-]{0,127}$")


class ChildSpecError(ValueError):
    """A child spec or supervisor flag is invalid; the message says which field and how to fix it."""


class ExitKind(StrEnum):
    """Why a child stopped, in OTP's three classes."""

    NORMAL = "normal"
    SHUTDOWN = "shutdown"
    ABNORMAL = "abnormal"


@dataclass(frozen=True)
class ExitReason:
    """A child's exit reason: normal, shutdown, or abnormal with a detail (crash, signal, hung, ...)."""

    kind: ExitKind
    detail: str = ""

    @classmethod
    def normal(cls, detail: str = "") -> ExitReason:
        return cls(ExitKind.NORMAL, detail)

    @classmethod
    def shutdown(cls, detail: str = "") -> ExitReason:
        return cls(ExitKind.SHUTDOWN, detail)

    @classmethod
    def abnormal(cls, detail: str) -> ExitReason:
        return cls(ExitKind.ABNORMAL, detail)

    @property
    def is_abnormal(self) -> bool:
        return self.kind is ExitKind.ABNORMAL

    def __str__(self) -> str:
        return f"{self.kind.value}({self.detail})" if self.detail else self.kind.value


# A child's graceful shutdown is the retire ladder's timeouts in seconds (docs/architecture.md §3:
# 5 s / 1 s / 1 s): one type, `legion.procs.RetireTimeouts`, which raises ValueError naming a bad field.
ShutdownMode: TypeAlias = RetireTimeouts | Literal["brutal_kill"]


@runtime_checkable
class ChildHandle(Protocol):
    """A running child as its supervisor sees it."""

    @property
    def id(self) -> str: ...

    async def wait_exit(self) -> ExitReason:
        """Resolve once the child has exited, with its reason (called once, by the supervisor)."""
        ...

    async def shutdown(self, mode: ShutdownMode) -> None:
        """Stop the child and return once it is gone; raise if that could not be verified."""
        ...


StartFn = Callable[[], Awaitable[ChildHandle]]


def _check_restart(child_id: str, restart: str) -> None:
    if restart not in RESTART_TYPES:
        raise ChildSpecError(
            f"child {child_id!r}: restart must be one of {', '.join(RESTART_TYPES)}, got {restart!r}"
        )


@dataclass(frozen=True)
class ChildSpec:
    """How to start, restart and stop one child (OTP child_spec)."""

    id: str
    start: StartFn = field(compare=False)
    restart: RestartType = "transient"
    shutdown: ShutdownMode = field(default_factory=RetireTimeouts)
    significant: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not _ID_PATTERN.match(self.id):
            raise ChildSpecError(
                f"child id must be 1-128 characters of letters, digits and _.:/@- starting with a letter "
                f"or digit, got {self.id!r}"
            )
        if not callable(self.start):
            raise ChildSpecError(f"child {self.id!r}: start must be an async factory, got {self.start!r}")
        _check_restart(self.id, self.restart)
        if not (isinstance(self.shutdown, RetireTimeouts) or self.shutdown == BRUTAL_KILL):
            raise ChildSpecError(
                f"child {self.id!r}: shutdown must be RetireTimeouts(...) or 'brutal_kill', got {self.shutdown!r}"
            )
        if not isinstance(self.significant, bool):
            raise ChildSpecError(f"child {self.id!r}: significant must be a bool, got {self.significant!r}")
        if self.significant and self.restart == "permanent":
            raise ChildSpecError(
                f"child {self.id!r}: a significant child cannot be permanent (OTP); use transient or temporary"
            )


def should_restart(restart: RestartType, reason: ExitReason) -> bool:
    """OTP restart policy: permanent always, transient only after an abnormal exit, temporary never."""
    if restart == "permanent":
        return True
    if restart == "transient":
        return reason.is_abnormal
    return False
