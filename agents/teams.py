"""Team selection (docs/spec-conformance.md §1.3): `LEGION_TEAM` env > `team` setting > `default`.

The env is a mapping passed in by the caller: the root process passes its own environment
(the documented selection point), a pooled session passes its per-session context env. Presence
of the key decides, so an explicit `LEGION_TEAM=default` overrides the setting (docs/spec-conformance.md §10 item 34). The default
team is never stored in `nodes.team` (NULL means the default roster).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from legion.agents.errors import TeamError
from legion.agents.schema import did_you_mean
from legion.agents.settings import DEFAULT_TEAM, Settings, Team

TEAM_ENV: Final = "LEGION_TEAM"


@dataclass(frozen=True)
class TeamSelection:
    name: str
    source: str  # "env" | "launch" | "card" | "settings" | "default"


def active_team(settings: Settings, env: Mapping[str, str]) -> TeamSelection:
    """The team this session works in: env key present > `team` setting > `default`."""
    if TEAM_ENV in env:
        name = env[TEAM_ENV].strip() or DEFAULT_TEAM
        return TeamSelection(name, "env")
    if settings.team is not None:
        return TeamSelection(settings.team, "settings")
    return TeamSelection(DEFAULT_TEAM, "default")


def team_for_launch(
    settings: Settings,
    env: Mapping[str, str],
    *,
    launch_team: str | None = None,
    card_team: str | None = None,
) -> TeamSelection:
    """A child's team: launch `team:` > card `team:` > the dispatching session's active team."""
    if launch_team is not None and launch_team.strip():
        return TeamSelection(launch_team.strip(), "launch")
    if card_team is not None:
        return TeamSelection(card_team, "card")
    return active_team(settings, env)


def require_team(settings: Settings, name: str) -> Team:
    """The roster for a team name; `default` without a definition is the empty default roster."""
    team = settings.teams.get(name)
    if team is not None:
        return team
    if name == DEFAULT_TEAM:
        return Team(name=DEFAULT_TEAM)
    hint = did_you_mean(name, settings.teams)
    known = ", ".join(sorted(settings.teams)) or "none (define one under 'teams' in .legion/settings.json)"
    raise TeamError(f"unknown team '{name}'{hint} Known teams: {known}")


def team_env(name: str) -> dict[str, str]:
    """The per-spawn env entry that carries a team to a child (explicit `default` included)."""
    return {TEAM_ENV: name}


def team_column(name: str | None) -> str | None:
    """The value to store in `nodes.team`: None for the default team, never the string `default`."""
    if name is None or not name.strip() or name.strip() == DEFAULT_TEAM:
        return None
    return name.strip()
