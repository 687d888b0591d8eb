"""The settings schema: every key, its type, range and default, declared once.

`SETTINGS_SPEC` is the single source of defaults; the in-process `maxActive` default is the one
that depends on presence (8 when an `inprocess` block exists without it, 30 with no block), so
its two values live here next to the schema and `build_settings` applies them.
"""

from __future__ import annotations

import re
from typing import Any, Final

from legion.agents.fields import KINDS, KNOWN_TOOLS, RESTART_TYPES, SLUG, SLUG_HINT
from legion.agents.modelspec import check_model_string, check_thinking
from legion.agents.schema import Bool, Custom, Either, Int, ListOf, MapOf, Num, Obj, Str, reference
from legion.ledger.constants import MAX_PENDING_AGE_MS

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
        # a completion notice held longer than this (its parent still running) counts toward `heldOverCap`
        "maxPendingAgeMs": _ms(MAX_PENDING_AGE_MS),
        # the tree-wide budget of one run (absent = unlimited); `legion run --max-cost` overrides maxCostUsd;
        # tokens of models with unknown prices count toward maxCostUsd at unknownCostPerMTokUsd (default 15)
        "budget": Obj({"maxCostUsd": Num(minimum=0), "maxTokens": Int(minimum=1, maximum=10**12),
                       "unknownCostPerMTokUsd": Num(minimum=0)},
                      what="legion.budget"),
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
                        {
                            "input": Num(minimum=0),
                            "output": Num(minimum=0),
                            "cacheRead": Num(minimum=0),
                            "cacheWrite": Num(minimum=0),
                        },
                        what="a model cost ($/M tokens; overrides genai-prices)",
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
# pi's models.json shape, as the workers' ProviderRegistry reads it (workers/providers/config.py).
# `apiKey` names the environment variable holding the key (pi's field); `apiKeyEnv` is accepted as a
# clearer synonym. `api` picks the wire protocol; `maxRetries` the SDK's retries of 429/5xx/overloaded.
PROVIDER_SPEC: Final = Obj(
    {
        "baseUrl": Str(pattern=re.compile(r"https?://\S+"), pattern_hint="an http(s):// URL"),
        "apiKey": _ENV_NAME,
        "apiKeyEnv": _ENV_NAME,
        "apiKeyLiteral": Str(),
        "api": Str(choices=("openai-completions", "anthropic-messages")),
        "headers": MapOf(Str(nonempty=False)),
        "timeoutMs": Int(minimum=1, maximum=_MS_MAX, unit="ms"),
        "maxRetries": Int(minimum=0, maximum=20),
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
        # the root session's model when neither --model nor the root card names one (README "Choosing a model")
        "defaultModel": Str(validate=_concrete_model),
        "team": _slug,
        "teams": MapOf(TEAM_SPEC, key=_slug),
        "presets": MapOf(PRESET_SPEC, key=_slug),
        "agentOverrides": MapOf(OVERRIDE_SPEC, key=_slug),
        "agentOverridesByProvider": BY_PROVIDER_SPEC,
        "providers": MapOf(PROVIDER_SPEC, key=_provider_name),
        # a run's startup housekeeping removes run directories idle this long; 0 keeps every run
        "retentionDays": Int(minimum=0, maximum=3650, default=14, unit="days"),
        "eventRetentionDays": Int(minimum=1, maximum=3650, default=30, unit="days"),
        "eventMaxRows": Int(minimum=1000, maximum=100_000_000, default=200_000),
    },
    what="settings",
)


def settings_reference() -> list[tuple[str, str, Any]]:
    """Every settings key: (dotted path, accepted type, default) — for docs, `legion init`, doctor."""
    rows = reference(SETTINGS_SPEC)
    return [
        (path, kind, INPROCESS_MAX_ACTIVE_WITHOUT_BLOCK if path == "inprocess.maxActive" else default)
        for path, kind, default in rows
    ]
