"""Settings: `.legion/settings.json` (project) deep-merged over `~/.config/legion/settings.json` (user).

The keys, types, ranges and defaults are declared once, in `settings_schema.SETTINGS_SPEC`.
Unknown keys and bad values are `SettingsError`s with the full dotted path and a suggestion.
Which values an operator wrote (in either file) is kept (`Settings.explicit`, docs/spec-conformance.md §10 item 18).
Provider-scoped sections (`providers`, `agentOverridesByProvider`) merge per provider; a
provider's `models` merge per model `id` (`merge.py`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from legion.agents.errors import SettingsError
from legion.agents.locations import process_env, project_settings_path, read_head, user_settings_path
from legion.agents.merge import deep_merge, explicit_paths, merge_settings
from legion.agents.modelspec import Thinking
from legion.agents.schema import SchemaError, did_you_mean
from legion.agents.settings_schema import (
    DEFAULT_TEAM,
    EXTERNAL_DIRECTORIES,
    INPROCESS_MAX_ACTIVE_IN_BLOCK,
    INPROCESS_MAX_ACTIVE_WITHOUT_BLOCK,
    INPROCESS_SPEC,
    LEGION_SPEC,
    PHASE_TIMEOUTS_MS,
    SETTINGS_SPEC,
    SUPERVISION_SPEC,
)

MAX_SETTINGS_BYTES: Final = 1024 * 1024


@dataclass(frozen=True)
class TeamMember:
    role: str
    name: str | None = None
    model: str | None = None
    preset: str | None = None
    thinking: Thinking = None


@dataclass(frozen=True)
class Team:
    name: str
    members: tuple[TeamMember, ...] = ()
    description: str = ""

    def member_for(self, role: str) -> TeamMember | None:
        """The first roster entry for a role (its model/preset overrides apply to launches of that role)."""
        return next((m for m in self.members if m.role == role), None)


@dataclass(frozen=True)
class Preset:
    name: str
    kind: str | None = None
    model: str | None = None
    thinking: Thinking = None
    description: str = ""


@dataclass(frozen=True)
class ProviderConfig:
    name: str
    base_url: str | None = None
    api_key_env: str | None = None
    api: str = "openai-completions"
    headers: Mapping[str, str] | None = None
    models: tuple[str, ...] = ()


@dataclass(frozen=True)
class InprocessLimits:
    max_active: int
    max_queued_launches: int
    launch_queue_timeout_ms: int
    start_timeout_ms: int


@dataclass(frozen=True)
class LegionLimits:
    """The `legion.*` block, typed (defaults filled)."""

    max_depth: int
    max_children_per_node: int
    max_active_nodes: int
    phase_timeouts_ms: Mapping[str, int]
    verify_command_timeout_ms: int
    worktree_bootstrap: str
    worktree_bootstrap_timeout_ms: int
    mail_rate_per_5min: int
    usage_poll_ms: int
    orphan_stale_ms: int
    silence_notice_ms: int
    loop_notice_ms: int
    max_pending_age_ms: int


@dataclass(frozen=True)
class Retention:
    retention_days: int
    event_retention_days: int
    event_max_rows: int


@dataclass(frozen=True)
class SupervisionSettings:
    max_restarts: int
    restart_period_ms: int
    backoff_base_ms: int
    backoff_cap_ms: int
    force_rpc: bool
    rpc_idle_grace_ms: int  # -1: never

    @property
    def rpc_idle_grace(self) -> float | None:
        """Seconds a settled rpc worker keeps its process (None: until the run ends)."""
        return None if self.rpc_idle_grace_ms < 0 else self.rpc_idle_grace_ms / 1000


class Settings:
    """Merged, validated, default-filled settings plus which dotted paths were written explicitly."""

    def __init__(
        self, data: dict[str, Any], explicit: Iterable[str] = (), sources: Iterable[str] = ()
    ) -> None:
        self.data = data
        self.explicit = frozenset(explicit)
        self.sources = tuple(sources)
        self.teams = {n: _team(n, t) for n, t in data.get("teams", {}).items()}
        self.presets = {n: _preset(n, p) for n, p in data.get("presets", {}).items()}
        self.providers = {n: _provider(n, p) for n, p in data.get("providers", {}).items()}
        self.agent_overrides: dict[str, dict[str, Any]] = data.get("agentOverrides", {})
        self.agent_overrides_by_provider: dict[str, dict[str, str]] = {
            prov: {role: o["model"] for role, o in roles.items()}
            for prov, roles in data.get("agentOverridesByProvider", {}).items()
        }

    def get(self, dotted: str, default: Any = None) -> Any:
        """The value at a dotted path (`legion.maxDepth`), defaults filled."""
        node: Any = self.data
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def is_explicit(self, dotted: str) -> bool:
        """True when an operator wrote this path (or something below it) in a settings file."""
        return dotted in self.explicit

    @property
    def enabled(self) -> bool:
        return bool(self.data["enabled"])

    @property
    def default_model(self) -> str | None:
        return self.data.get("defaultModel")

    @property
    def team(self) -> str | None:
        return self.data.get("team")

    @property
    def external_directories(self) -> tuple[str, ...]:
        """The configured working directories a launch may name besides its caller's (as written; `~` unexpanded)."""
        return tuple(self.data.get(EXTERNAL_DIRECTORIES) or ())

    @property
    def inprocess(self) -> InprocessLimits:
        block = self.data["inprocess"]
        return InprocessLimits(
            block["maxActive"],
            block["maxQueuedLaunches"],
            block["launchQueueTimeoutMs"],
            block["startTimeoutMs"],
        )

    @property
    def legion(self) -> LegionLimits:
        g = self.data["legion"]
        return LegionLimits(
            max_depth=g["maxDepth"],
            max_children_per_node=g["maxChildrenPerNode"],
            max_active_nodes=g["maxActiveNodes"],
            phase_timeouts_ms=dict(g["phaseTimeouts"]),
            verify_command_timeout_ms=g["verifyCommandTimeoutMs"],
            worktree_bootstrap=g["worktreeBootstrap"],
            worktree_bootstrap_timeout_ms=g["worktreeBootstrapTimeoutMs"],
            mail_rate_per_5min=g["mailRatePer5Min"],
            usage_poll_ms=g["usagePollMs"],
            orphan_stale_ms=g["orphanStaleMs"],
            silence_notice_ms=g["silenceNoticeMs"],
            loop_notice_ms=g["loopNoticeMs"],
            max_pending_age_ms=g["maxPendingAgeMs"],
        )

    @property
    def retention(self) -> Retention:
        return Retention(
            self.data["retentionDays"], self.data["eventRetentionDays"], self.data["eventMaxRows"]
        )

    @property
    def supervision(self) -> SupervisionSettings:
        s = self.data["supervision"]
        return SupervisionSettings(
            s["maxRestarts"], s["restartPeriodMs"], s["backoffBaseMs"], s["backoffCapMs"], s["forceRpc"],
            s["rpcIdleGraceMs"],
        )

    def phase_timeout_ms(self, phase: str, card_timeout_ms: int | None = None) -> int:
        """Clock-source chain: explicit operator value → card `phases[].timeoutMs` → built-in → 0 (never)."""
        if self.is_explicit(f"legion.phaseTimeouts.{phase}"):
            return int(self.data["legion"]["phaseTimeouts"][phase])
        if card_timeout_ms is not None:
            return card_timeout_ms
        return PHASE_TIMEOUTS_MS.get(phase, 0)


def _team(name: str, raw: dict[str, Any]) -> Team:
    members = tuple(
        TeamMember(role=m)
        if isinstance(m, str)
        else TeamMember(
            role=m["role"],
            name=m.get("name"),
            model=m.get("model"),
            preset=m.get("preset"),
            thinking=m.get("thinking"),
        )
        for m in raw.get("members", [])
    )
    return Team(name=name, members=members, description=raw.get("description", ""))


def _preset(name: str, raw: dict[str, Any]) -> Preset:
    return Preset(name, raw.get("kind"), raw.get("model"), raw.get("thinking"), raw.get("description", ""))


def _provider(name: str, raw: dict[str, Any]) -> ProviderConfig:
    models = tuple(m["id"] for m in raw.get("models", []))
    return ProviderConfig(
        name,
        raw.get("baseUrl"),
        raw.get("apiKey"),
        raw.get("api", "anthropic-messages" if name == "anthropic" else "openai-completions"),
        raw.get("headers"),
        models,
    )


def _normalise_providers(providers: dict[str, Any], where: str | None) -> None:
    """One shape for consumers: `apiKey` holds the env var name, every model is an `{id, …}` object."""
    for name, prov in providers.items():
        synonym = prov.pop("apiKeyEnv", None)
        if synonym is not None:
            if prov.get("apiKey", synonym) != synonym:
                raise SettingsError(
                    "apiKey and apiKeyEnv name different variables; keep one",
                    dotted=f"providers.{name}",
                    path=where,
                )
            prov["apiKey"] = synonym
        if "models" in prov:
            prov["models"] = [{"id": m} if isinstance(m, str) else m for m in prov["models"]]


# --- loading -------------------------------------------------------------------------------------


def load_settings(
    cwd: str | Path,
    *,
    env: Mapping[str, str] | None = None,
    user_path: str | Path | None = None,
    project_path: str | Path | None = None,
) -> Settings:
    """Read user then project settings (missing files are fine), validate each, merge, fill defaults."""
    env = process_env() if env is None else env
    paths = [Path(user_path) if user_path else user_settings_path(env)]
    paths.append(Path(project_path) if project_path else project_settings_path(cwd))
    raws: list[dict[str, Any]] = []
    sources: list[str] = []
    for path in paths:
        raw = read_settings_file(path)
        if raw is not None:
            raws.append(raw)
            sources.append(str(path))
    return build_settings(raws, sources=sources)


def read_settings_file(path: Path) -> dict[str, Any] | None:
    """One settings file, validated on its own (errors name it); None when it does not exist."""
    try:
        data = read_head(path, MAX_SETTINGS_BYTES)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SettingsError(f"cannot read settings: {exc.strerror or exc}", path=path) from None
    return parse_settings_bytes(data, path=str(path))


def parse_settings_bytes(data: bytes, *, path: str = "<settings>") -> dict[str, Any]:
    """Decode and validate one settings file's bytes; returns the raw (undefaulted) mapping."""
    if len(data) > MAX_SETTINGS_BYTES:
        raise SettingsError(
            f"settings file is larger than the limit of {MAX_SETTINGS_BYTES} bytes", path=path, line=1
        )
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise SettingsError(
            f"not valid UTF-8 (byte {exc.start}); save it as UTF-8 JSON",
            path=path,
            line=data[: exc.start].count(b"\n") + 1,
        ) from None
    if not text.strip():
        return {}
    try:
        raw = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise SettingsError(
            f"invalid JSON at column {exc.colno}: {exc.msg}", path=path, line=exc.lineno
        ) from None
    except _DuplicateKey as exc:
        key = str(exc.args[0])
        raise SettingsError(
            f"duplicate key '{key}' in the JSON; keep one", path=path, line=_key_line(text, [key], last=True)
        ) from None
    except (ValueError, RecursionError) as exc:
        raise SettingsError(f"invalid JSON: {type(exc).__name__}", path=path, line=1) from None
    if not isinstance(raw, dict):
        raise SettingsError(f"settings must be a JSON object (got a {type(raw).__name__})", path=path, line=1)
    _validate(raw, path, text=text)
    return raw


def _key_line(text: str, keys: list[str], *, last: bool = False) -> int | None:
    """The line of a dotted path's innermost key in JSON text: each key searched after the previous one."""
    pos, found = 0, None
    for key in keys:
        pattern = re.compile(re.escape(json.dumps(key, ensure_ascii=False)) + r"\s*:")
        hits = list(pattern.finditer(text, pos)) if last else [m for m in [pattern.search(text, pos)] if m]
        if not hits:
            break
        found = hits[-1].start()
        pos = hits[-1].end()
    return None if found is None else text.count("\n", 0, found) + 1


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _validate(raw: dict[str, Any], path: str | None, *, text: str | None = None) -> dict[str, Any]:
    """Check against the schema; with the file's `text`, errors also carry the offending key's line."""
    try:
        return SETTINGS_SPEC.check(raw, "")
    except SchemaError as exc:
        keys = [k for k in re.split(r"\.|\[\d+\]", exc.path) if k]
        line = _key_line(text, keys) if text is not None else None
        raise SettingsError(exc.message, dotted=exc.path, path=path, line=line) from None
    except RecursionError:
        raise SettingsError(
            "settings are nested too deeply", path=path, line=1 if text is not None else None
        ) from None


def build_settings(raws: Iterable[Mapping[str, Any]], *, sources: Iterable[str] = ()) -> Settings:
    """Merge raw settings (weakest first), validate the result, cross-check references, fill defaults."""
    merged: dict[str, Any] = {}
    explicit: set[str] = set()
    names = list(sources)
    for n, raw in enumerate(raws):
        if not isinstance(raw, Mapping):
            raise SettingsError(
                f"settings must be an object (got a {type(raw).__name__})", path=_name(names, n)
            )
        _validate(dict(raw), _name(names, n))  # each source on its own first, so errors name their file
        merged = merge_settings(merged, raw)
        explicit |= explicit_paths(raw, "")
    where = " + ".join(names) or None
    checked = _validate(merged, where)
    _cross_check(checked, where)
    _normalise_providers(checked.get("providers", {}), where)
    data = deep_merge(SETTINGS_SPEC.defaults(), checked)
    data.setdefault("inprocess", {})
    if "maxActive" not in data["inprocess"]:
        in_block = "inprocess" in explicit
        data["inprocess"]["maxActive"] = (
            INPROCESS_MAX_ACTIVE_IN_BLOCK if in_block else INPROCESS_MAX_ACTIVE_WITHOUT_BLOCK
        )
    for key, spec in (
        ("inprocess", INPROCESS_SPEC),
        ("supervision", SUPERVISION_SPEC),
        ("legion", LEGION_SPEC),
    ):
        data[key] = deep_merge(spec.defaults(), data.get(key, {}))
    return Settings(data, explicit, sources)


def _name(names: list[str], n: int) -> str | None:
    return names[n] if n < len(names) else None


def _cross_check(data: Mapping[str, Any], where: str | None) -> None:
    """References between sections: the active team and presets named by members/overrides exist."""
    sup = data.get("supervision", {})
    base = sup.get("backoffBaseMs", SUPERVISION_SPEC.defaults()["backoffBaseMs"])
    cap = sup.get("backoffCapMs", SUPERVISION_SPEC.defaults()["backoffCapMs"])
    if base > cap:
        raise SettingsError(
            f"the restart backoff starts at {base} ms but is capped at {cap} ms; raise backoffCapMs "
            "or lower backoffBaseMs",
            dotted="supervision.backoffBaseMs",
            path=where,
        )
    teams = data.get("teams", {})
    presets = data.get("presets", {})
    team = data.get("team")
    if team is not None and team != DEFAULT_TEAM and team not in teams:
        _missing("team", team, teams, "team", where)
    for tname, tdata in teams.items():
        for n, member in enumerate(tdata.get("members", [])):
            if isinstance(member, dict) and member.get("preset") and member["preset"] not in presets:
                _missing(f"teams.{tname}.members[{n}].preset", member["preset"], presets, "preset", where)
    for role, override in data.get("agentOverrides", {}).items():
        if override.get("preset") and override["preset"] not in presets:
            _missing(f"agentOverrides.{role}.preset", override["preset"], presets, "preset", where)


def _missing(dotted: str, name: str, known: Mapping[str, Any], what: str, where: str | None) -> None:
    hint = did_you_mean(name, known)
    listing = ", ".join(sorted(known)) or f"none defined (add one under '{what}s')"
    raise SettingsError(f"unknown {what} '{name}'{hint} Known {what}s: {listing}", dotted=dotted, path=where)
