"""Settings: `.legion/settings.json` (project) deep-merged over `~/.config/legion/settings.json` (user).

Every key, its type, range and default is declared once, in the schema below (`SETTINGS_SPEC`;
the in-process `maxActive` block rule is the one default that depends on presence, next to it).
Unknown keys and bad values are `SettingsError`s with the full dotted path and a suggestion.
Which values an operator wrote (in either file) is kept (`Settings.explicit`, SEED-SPEC §10 item 18).
Provider-scoped sections (`providers`, `agentOverridesByProvider`) merge per provider; a
provider's `models` merge per model `id`.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from legion.agents.errors import SettingsError
from legion.agents.fields import KINDS, KNOWN_TOOLS, RESTART_TYPES, SLUG, SLUG_HINT
from legion.agents.locations import process_env, project_settings_path, user_settings_path
from legion.agents.modelspec import Thinking, check_model_string, check_thinking
from legion.agents.schema import (
    Bool,
    Custom,
    Either,
    Int,
    ListOf,
    MapOf,
    Num,
    Obj,
    SchemaError,
    Str,
    closest,
    reference,
)

MAX_SETTINGS_BYTES: Final = 1024 * 1024
DEFAULT_TEAM: Final = "default"

# --- defaults (the one place) -------------------------------------------------------------------
PHASE_TIMEOUTS_MS: Final = {
    "planning": 900_000,
    "implementing": 3_600_000,
    "reviewing": 1_800_000,
    "verifying": 900_000,
}
INPROCESS_MAX_ACTIVE_WITHOUT_BLOCK: Final = 30
INPROCESS_MAX_ACTIVE_IN_BLOCK: Final = 8
_MS_MAX: Final = 7 * 24 * 3600 * 1000


def _ms(default: int, minimum: int = 1) -> Int:
    return Int(minimum=minimum, maximum=_MS_MAX, default=default, unit="ms")


_slug = Str(pattern=SLUG, pattern_hint=SLUG_HINT)
_phase_id = Str(pattern=re.compile(r"[a-z][a-z0-9_-]{0,31}"), pattern_hint="a phase id [a-z][a-z0-9_-]{0,31}")
_provider_name = Str(
    pattern=re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"), pattern_hint="a provider name [A-Za-z0-9._-]"
)
_model = Str(validate=check_model_string)


def _concrete_model(value: str, path: str) -> str:
    return check_model_string(value, path, allow_inherit=False)


LEGION_SPEC: Final = Obj(
    {
        "maxDepth": Int(minimum=1, maximum=64, default=4),
        "maxChildrenPerNode": Int(minimum=1, maximum=1000, default=8),
        "maxActiveNodes": Int(minimum=1, maximum=10_000, default=30),
        "phaseTimeouts": MapOf(
            Int(minimum=0, maximum=_MS_MAX, unit="ms"), key=_phase_id, default=PHASE_TIMEOUTS_MS
        ),
        "verifyCommandTimeoutMs": _ms(600_000),
        "worktreeBootstrap": Str(nonempty=False, default=""),
        "worktreeBootstrapTimeoutMs": _ms(600_000),
        "mailRatePer5Min": Int(minimum=1, maximum=10_000, default=10),
        "usagePollMs": _ms(30_000),
        "orphanStaleMs": _ms(90_000),
        "silenceNoticeMs": Int(minimum=-1, maximum=_MS_MAX, default=120_000, unit="ms (0 or -1 disables)"),
    },
    what="legion",
)
INPROCESS_SPEC: Final = Obj(
    {
        "maxActive": Int(minimum=1, maximum=10_000),  # default depends on the block: see _fill_inprocess
        "maxQueuedLaunches": Int(minimum=0, maximum=100_000, default=32),
        "launchQueueTimeoutMs": _ms(900_000),
        "startTimeoutMs": _ms(15_000),
    },
    what="inprocess",
)
SUPERVISION_SPEC: Final = Obj(
    {
        "maxRestarts": Int(minimum=0, maximum=1000, default=3),
        "restartPeriodMs": _ms(60_000),
        "backoffBaseMs": _ms(100, minimum=0),
        "backoffCapMs": _ms(5_000, minimum=0),
        "forceRpc": Bool(default=False),
    },
    what="supervision",
)
MEMBER_SPEC: Final = Either(
    (
        (lambda v: isinstance(v, str), _slug),
        (
            lambda v: isinstance(v, dict),
            Obj(
                {
                    "role": _slug,
                    "name": _slug,
                    "model": _model,
                    "preset": Str(),
                    "thinking": Custom(check_thinking),
                },
                what="a team member",
                required=("role",),
            ),
        ),
    ),
    expected="a role name or a member object {role, name, model, preset, thinking}",
)
TEAM_SPEC: Final = Obj({"members": ListOf(MEMBER_SPEC), "description": Str(nonempty=False)}, what="a team")
PRESET_SPEC: Final = Obj(
    {
        "kind": Str(choices=KINDS),
        "model": _model,
        "thinking": Custom(check_thinking),
        "description": Str(nonempty=False),
    },
    what="a preset",
)
OVERRIDE_SPEC: Final = Obj(
    {
        "model": _model,
        "thinking": Custom(check_thinking),
        "preset": Str(),
        "disabled": Bool(),
        "fallbackModels": ListOf(_model, unique=True),
        "tools": ListOf(Str(choices=KNOWN_TOOLS), unique=True, allow_csv=True),
        "timeoutMs": Int(minimum=1, maximum=_MS_MAX, unit="ms"),
        "toolTimeoutMs": Int(minimum=1, maximum=_MS_MAX, unit="ms"),
        "toolBudget": Int(minimum=1, maximum=100_000),
        "turnBudget": Int(minimum=1, maximum=100_000),
        "restart": Str(choices=RESTART_TYPES),
        "maxRestarts": Int(minimum=0, maximum=1000),
        "restartPeriodMs": Int(minimum=1, maximum=_MS_MAX, unit="ms"),
    },
    what="an agent override",
)
BY_PROVIDER_SPEC: Final = MapOf(
    MapOf(
        Obj({"model": _model}, what="a provider-scoped override (model only)", required=("model",)), key=_slug
    ),
    key=_provider_name,
)
PROVIDER_MODEL_SPEC: Final = Either(
    (
        (lambda v: isinstance(v, str), Str()),
        (
            lambda v: isinstance(v, dict),
            Obj(
                {
                    "id": Str(),
                    "name": Str(),
                    "contextWindow": Int(minimum=1),
                    "maxTokens": Int(minimum=1),
                    "reasoning": Bool(),
                    "cost": Obj(
                        {"input": Num(minimum=0), "output": Num(minimum=0)}, what="a model cost ($/M tokens)"
                    ),
                },
                what="a provider model",
                required=("id",),
            ),
        ),
    ),
    expected="a model id or an object {id, name, contextWindow, maxTokens, reasoning, cost}",
)
_ENV_NAME = Str(pattern=re.compile(r"[A-Za-z_][A-Za-z0-9_]*"), pattern_hint="an environment variable name")
# pi's models.json shape, as the workers' ProviderRegistry reads it. `apiKey` names the environment
# variable holding the key (pi's field); `apiKeyEnv` is accepted as a clearer synonym.
PROVIDER_SPEC: Final = Obj(
    {
        "baseUrl": Str(pattern=re.compile(r"https?://\S+"), pattern_hint="an http(s):// URL"),
        "apiKey": _ENV_NAME,
        "apiKeyEnv": _ENV_NAME,
        "apiKeyLiteral": Str(),
        "api": Str(choices=("openai-completions",)),
        "headers": MapOf(Str(nonempty=False)),
        "timeoutMs": Int(minimum=1, maximum=_MS_MAX, unit="ms"),
        "models": ListOf(PROVIDER_MODEL_SPEC),
    },
    what="a provider",
)
SETTINGS_SPEC: Final = Obj(
    {
        "enabled": Bool(default=True),
        "legion": LEGION_SPEC,
        "inprocess": INPROCESS_SPEC,
        "supervision": SUPERVISION_SPEC,
        "defaultModel": Str(validate=_concrete_model),
        "team": _slug,
        "teams": MapOf(TEAM_SPEC, key=_slug),
        "presets": MapOf(PRESET_SPEC, key=_slug),
        "agentOverrides": MapOf(OVERRIDE_SPEC, key=_slug),
        "agentOverridesByProvider": BY_PROVIDER_SPEC,
        "providers": MapOf(PROVIDER_SPEC, key=_provider_name),
        "retentionDays": Int(minimum=1, maximum=3650, default=14, unit="days"),
        "eventRetentionDays": Int(minimum=1, maximum=3650, default=30, unit="days"),
        "eventMaxRows": Int(minimum=1000, maximum=100_000_000, default=200_000),
    },
    what="settings",
)
# ------------------------------------------------------------------------------------------------


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
            s["maxRestarts"], s["restartPeriodMs"], s["backoffBaseMs"], s["backoffCapMs"], s["forceRpc"]
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
        raw.get("api", "openai-completions"),
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


def settings_reference() -> list[tuple[str, str, Any]]:
    """Every settings key: (dotted path, accepted type, default) — for docs, `legion init`, doctor."""
    rows = reference(SETTINGS_SPEC)
    return [
        (path, kind, INPROCESS_MAX_ACTIVE_WITHOUT_BLOCK if path == "inprocess.maxActive" else default)
        for path, kind, default in rows
    ]


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
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SettingsError(f"cannot read settings: {exc.strerror or exc}", path=path) from None
    return parse_settings_bytes(data, path=str(path))


def parse_settings_bytes(data: bytes, *, path: str = "<settings>") -> dict[str, Any]:
    """Decode and validate one settings file's bytes; returns the raw (undefaulted) mapping."""
    if len(data) > MAX_SETTINGS_BYTES:
        raise SettingsError(
            f"settings file is {len(data)} bytes; the limit is {MAX_SETTINGS_BYTES}", path=path
        )
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise SettingsError(f"not valid UTF-8 (byte {exc.start}); save it as UTF-8 JSON", path=path) from None
    if not text.strip():
        return {}
    try:
        raw = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise SettingsError(
            f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}", path=path
        ) from None
    except _DuplicateKey as exc:
        raise SettingsError(f"duplicate key '{exc.args[0]}' in the JSON", path=path) from None
    except (ValueError, RecursionError) as exc:
        raise SettingsError(f"invalid JSON: {type(exc).__name__}", path=path) from None
    if not isinstance(raw, dict):
        raise SettingsError(f"settings must be a JSON object (got a {type(raw).__name__})", path=path)
    _validate(raw, path)
    return raw


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _validate(raw: dict[str, Any], path: str | None) -> dict[str, Any]:
    try:
        return SETTINGS_SPEC.check(raw, "")
    except SchemaError as exc:
        raise SettingsError(exc.message, dotted=exc.path, path=path) from None
    except RecursionError:
        raise SettingsError("settings are nested too deeply", path=path) from None


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
        explicit |= _paths(raw, "")
    where = " + ".join(names) or None
    checked = _validate(merged, where)
    _cross_check(checked, where)
    _normalise_providers(checked.get("providers", {}), where)
    data = _deep_merge(SETTINGS_SPEC.defaults(), checked)
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
        data[key] = _deep_merge(spec.defaults(), data.get(key, {}))
    return Settings(data, explicit, sources)


def _name(names: list[str], n: int) -> str | None:
    return names[n] if n < len(names) else None


def merge_settings(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge `over` onto `base`; provider sections per provider, provider models per id."""
    out = _deep_merge(dict(base), {k: v for k, v in over.items() if k != "providers"})
    if "providers" in over and isinstance(over["providers"], dict):
        providers = dict(out.get("providers") or {})
        for name, section in over["providers"].items():
            old = providers.get(name)
            if isinstance(old, dict) and isinstance(section, dict):
                merged = _deep_merge(old, {k: v for k, v in section.items() if k != "models"})
                if "models" in section:
                    merged["models"] = _merge_models(old.get("models"), section["models"])
                providers[name] = merged
            else:
                providers[name] = copy.deepcopy(section)
        out["providers"] = providers
    return out


def _merge_models(old: Any, new: Any) -> Any:
    if not isinstance(old, list) or not isinstance(new, list):
        return copy.deepcopy(new)

    def key(m: Any) -> Any:
        return m if isinstance(m, str) else (m.get("id") if isinstance(m, dict) else repr(m))

    replaced = {key(m) for m in new}
    return [m for m in old if key(m) not in replaced] + copy.deepcopy(new)


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _paths(raw: Mapping[str, Any], prefix: str) -> set[str]:
    out: set[str] = set()
    for key, value in raw.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        out.add(dotted)
        if isinstance(value, dict):
            out |= _paths(value, dotted)
    return out


def _cross_check(data: Mapping[str, Any], where: str | None) -> None:
    """References between sections: the active team and presets named by members/overrides exist."""
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
    near = closest(name, known)
    hint = f" — did you mean '{near}'?" if near else ""
    listing = ", ".join(sorted(known)) or f"none defined (add one under '{what}s')"
    raise SettingsError(f"unknown {what} '{name}'{hint} Known {what}s: {listing}", dotted=dotted, path=where)
