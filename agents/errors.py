"""Error types of the definition layer: one base class, specific subclasses.

Every error raised by `legion.agents` while loading or resolving definitions is an
`AgentDefinitionError`; callers may catch that one type at a boundary.
"""

from __future__ import annotations

from pathlib import Path

from legion.codes import INVALID_CARD, INVALID_DEFINITION, INVALID_PARAMS, INVALID_SETTINGS, INVALID_VERDICT


class AgentDefinitionError(Exception):
    """Base error: a definition (card, settings, team, preset, model) is unusable."""

    code = INVALID_DEFINITION

    def __init__(self, message: str, *, path: str | Path | None = None, line: int | None = None) -> None:
        self.message = message
        self.path = str(path) if path is not None else None
        self.line = line
        super().__init__(self._render())

    def _render(self) -> str:
        if self.path is None:
            return self.message
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        return f"{where}: {self.message}"


class CardError(AgentDefinitionError):
    """A role card cannot be read, parsed or validated."""

    code = INVALID_CARD


class UnknownFieldError(CardError):
    """A card (or settings) key that is not in the field table."""


class CatalogError(AgentDefinitionError):
    """Several card errors collected while loading a catalog (strict mode)."""

    def __init__(self, errors: list[AgentDefinitionError]) -> None:
        self.errors = list(errors)
        head = f"{len(self.errors)} role card error(s):"
        super().__init__("\n".join([head, *(f"  {e}" for e in self.errors)]))


class SettingsError(AgentDefinitionError):
    """A settings file cannot be read, parsed or validated (message carries the dotted path)."""

    code = INVALID_SETTINGS

    def __init__(
        self,
        message: str,
        *,
        dotted: str | None = None,
        path: str | Path | None = None,
        line: int | None = None,
    ) -> None:
        self.dotted = dotted
        super().__init__(f"{dotted}: {message}" if dotted else message, path=path, line=line)


class TeamError(AgentDefinitionError):
    """An unknown team was selected or referenced."""

    code = INVALID_PARAMS


class PresetError(AgentDefinitionError):
    """A referenced preset does not exist (never silently falls back)."""

    code = INVALID_PARAMS


class ModelResolutionError(AgentDefinitionError):
    """No usable model for a launch (e.g. `inherit` with no parent model); refuses the launch."""

    code = INVALID_PARAMS


class VerdictError(AgentDefinitionError):
    """A reviewer's answer has no well-formed `legion-verdict` block."""

    code = INVALID_VERDICT
