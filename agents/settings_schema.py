"""The settings schema: every key, its type, range and default, declared once.

`SETTINGS_SPEC` is the single source of defaults; the in-process `maxActive` default is the one
that depends on presence (8 when an `inprocess` block exists without it, 30 with no block), so
its two values live here next to the schema and `build_settings` applies them.
"""

from __future__ import annotations

import re
from typing import Any, Final, NamedTuple

from legion.agents.fields import KINDS, KNOWN_TOOLS, RESTART_TYPES, SLUG, SLUG_HINT
from legion.agents.modelspec import check_model_string, check_thinking
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
    keys,
    type_name,
)
from legion.ledger.constants import MAX_PENDING_AGE_MS

DEFAULT_TEAM: Final = "default"
EXTERNAL_DIRECTORIES: Final = "externalDirectories"  # the working directories a launch may name besides its caller's
HOME_PREFIX: Final = re.compile(r"^(~|\$HOME|\$\{HOME\})(?=/|$)")  # what a configured directory may start with

# --- defaults (the one place) -------------------------------------------------------------------
PHASE_TIMEOUTS_MS: Final = {
    "planning": 900_000,
    "implementing": 3_600_000,
    "reviewing": 1_800_000,
    "verifying": 900_000,
}
INPROCESS_MAX_ACTIVE_WITHOUT_BLOCK: Final = 30
INPROCESS_MAX_ACTIVE_IN_BLOCK: Final = 8
# how long a settled rpc worker keeps its process before it gives it back (docs/architecture.md §3)
RPC_IDLE_GRACE_MS: Final = 3_000
# stall notices (docs/spec-conformance.md §6.8): the L1 silence period and the L2 long-running radius
SILENCE_NOTICE_MS: Final = 120_000
LOOP_NOTICE_MS: Final = 20 * 60_000
_MS_MAX: Final = 7 * 24 * 3600 * 1000
UNREACHABLE_PAUSE_MS: Final = 60_000  # a PostgreSQL ledger unreachable this long pauses the run


def _ms(default: int, minimum: int = 1) -> Int:
    return Int(minimum=minimum, maximum=_MS_MAX, default=default, unit="ms")


_slug = Str(pattern=SLUG, pattern_hint=SLUG_HINT)
_phase_id = Str(pattern=re.compile(r"[a-z][a-z0-9_-]{0,31}"), pattern_hint="a phase id [a-z][a-z0-9_-]{0,31}")
_provider_name = Str(
    pattern=re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"), pattern_hint="a provider name [A-Za-z0-9._-]"
)
_model = Str(validate=check_model_string)


def _external_directory(value: str, path: str) -> str:
    """An absolute path, or one starting with `~`, `$HOME` or `${HOME}` (expanded when a launch is admitted)."""
    if not (value.startswith("/") or HOME_PREFIX.match(value)):
        raise SchemaError(path, f"must be an absolute directory path (`~`, `$HOME` and `${{HOME}}` expand), got "
                                f"{value!r}: a relative one would depend on where legion runs")
    return value


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
        # stall notices to a child's parent (docs/spec-conformance.md §6.8): L1 after this much silence with no tool
        # running; L2 each time a run has gone on another loopNoticeMs (a card's `loopNoticeMs` wins for its role)
        "silenceNoticeMs": Int(minimum=-1, maximum=_MS_MAX, default=SILENCE_NOTICE_MS, unit="ms (0 or -1 disables)"),
        "loopNoticeMs": Int(minimum=0, maximum=_MS_MAX, default=LOOP_NOTICE_MS, unit="ms (0 disables)"),
        # a completion notice held longer than this (its parent still running) counts toward `heldOverCap`
        "maxPendingAgeMs": _ms(MAX_PENDING_AGE_MS),
        # the tree-wide budget of one run (absent = unlimited); `legion run --max-cost` overrides maxCostUsd;
        # tokens of models with unknown prices count toward maxCostUsd at unknownCostPerMTokUsd (default 15)
        # fleetMaxCostUsd: one limit shared by every run of the project in one PostgreSQL ledger
        # (orchestration/fleet_budget.py, docs/servers.md "Fleet-wide budget")
        "budget": Obj({"maxCostUsd": Num(minimum=0), "maxTokens": Int(minimum=1, maximum=10**12),
                       "unknownCostPerMTokUsd": Num(minimum=0), "fleetMaxCostUsd": Num(minimum=0)},
                      what="legion.budget",
                      docs={"maxCostUsd": "The run's tree-wide cost limit in USD; `legion run --max-cost` overrides it. A "
                                          "launch that would exceed it is refused (`BUDGET_EXCEEDED`) and every session "
                                          "checks it before each model call. Unset: no cost limit.",
                            "maxTokens": "The run's tree-wide limit on tokens (input + output of every session). Unset: "
                                         "no token limit.",
                            "unknownCostPerMTokUsd": "USD per million tokens charged against `maxCostUsd` for a model "
                                                     "without a known price. Unset: 15.",
                            "fleetMaxCostUsd": "The project's fleet-wide cost limit in USD, shared by every run of the "
                                               "project (`legion.project`) that records into the same PostgreSQL "
                                               "ledger: what they all spent plus what their live launches hold. A "
                                               "launch that would exceed it is refused (`BUDGET_EXCEEDED`, scope "
                                               "`fleet-cost`) and sessions check it before each model call. On a "
                                               "SQLite ledger it can only see, and limits, the run itself. Unset: no "
                                               "fleet limit."}),
        # the fleet a run belongs to in a shared ledger (legion/fleet.py)
        "project": Str(),
        # where a run records its ledger: a postgresql:// URL (checked by `legion run` before anything starts)
        "ledger": Obj({"url": Str(), "keepRows": Bool(default=False),
                       "unreachablePauseMs": _ms(UNREACHABLE_PAUSE_MS, minimum=100)}, what="legion.ledger",
                      docs={"url": "A `postgresql://USER@HOST:PORT/DATABASE` URL: new runs record their ledger "
                                   "there, each run's rows under its run id (docs/servers.md). `legion run --ledger` "
                                   "and the environment variable `LEGION_LEDGER_URL` override it. Unset: each run "
                                   "keeps a SQLite `legion.db` in its run directory.",
                            "keepRows": "When the startup housekeeping removes a run directory idle for "
                                        "`retentionDays`, whose run recorded into a PostgreSQL ledger, its rows there "
                                        "are deleted with it (in one transaction; a run that wrote there within "
                                        "`retentionDays` keeps its directory and rows). `true` keeps the rows: the "
                                        "database is the archive.",
                            "unreachablePauseMs": "A run whose PostgreSQL ledger server stays unreachable this long "
                                                  "pauses (exit 130, as `legion stop RUN --all` does) rather than run "
                                                  "unrecorded; until then its writes are kept and retried. `legion "
                                                  "resume` waits as long (at least 30 s) for the server "
                                                  "(docs/servers.md)."}),
    },
    what="legion",
    docs={
        "maxDepth": "How deep the tree may grow below the root session; a card's `maxSubagentDepth` can only "
                    "tighten it, and 4 is the hard ceiling (a larger value is used as 4, with a warning).",
        "maxChildrenPerNode": "Live children one node may have at once; one more launch is refused (`BUDGET_EXCEEDED`).",
        "maxActiveNodes": "Live nodes in the whole run at once; one more launch is refused (`BUDGET_EXCEEDED`).",
        "phaseTimeouts": "Milliseconds a team may stay in each phase (by phase id) before a `phase_timeout` event "
                         "and a notice to its lead; a notice only, nothing is stopped. 0 turns a phase's notice off.",
        "verifyCommandTimeoutMs": "Each verification command a team's `verifying` phase runs in its worktree is "
                                  "killed (with its process tree) after this long.",
        "worktreeBootstrap": "A shell command run in a team's new git worktree before its lead starts (e.g. "
                             "`npm ci`); a failure removes the worktree and its branch again. Empty: none.",
        "worktreeBootstrapTimeoutMs": "How long `worktreeBootstrap` may run before it is killed and the launch fails.",
        "mailRatePer5Min": "Mails one node may send in any 5 minutes; beyond it `legion_mail` is refused.",
        "usagePollMs": "Accepted for compatibility with the original's settings; legion does not poll usage (a "
                       "session reports it after each model call), so the value is not used.",
        "orphanStaleMs": "A node the ledger shows live but no process hosts is marked failed (`node_abandoned`) "
                         "once it has been silent this long.",
        "silenceNoticeMs": "A live child with no session event for this long and no tool running gets a stall "
                           "notice (L1) to its parent, at most 2 per run of the child; 0 or -1 turns it off.",
        "loopNoticeMs": "Each time a child's run has gone on another this long, its parent gets a long-running "
                        "notice (L2) naming the oldest tool in flight, at most 3; a card's `loopNoticeMs` (or "
                        "`agentOverrides.<name>.loopNoticeMs`) wins for its role. 0 turns it off.",
        "maxPendingAgeMs": "A completion notice held longer than this while its parent is still running counts "
                           "once toward the `heldOverCap` health signal (logged, published, shown by "
                           "`subagent diagnose`); nothing is sent.",
        "budget": "The run's tree-wide budget (cost and tokens) and the project's fleet-wide cost budget; each key "
                  "unset means no limit.",
        "ledger": "Where new runs record their ledger.",
        "project": "The project's name in a shared PostgreSQL ledger: the fleet view groups runs by it and a "
                   "fleet-wide budget is shared by its runs. Unset: the git remote `origin` (as host/path), else the "
                   "project directory's name.",
    },
)
INPROCESS_SPEC: Final = Obj(
    {
        "maxActive": Int(minimum=1, maximum=10_000),  # default depends on the block: see _fill_inprocess
        "maxQueuedLaunches": Int(minimum=0, maximum=100_000, default=32),
        "launchQueueTimeoutMs": _ms(900_000),
        "startTimeoutMs": _ms(15_000),
    },
    what="inprocess",
    docs={
        "maxActive": "Sessions the in-process pool hosts at once; further launches wait in its admission queue. "
                     "Default 30 without an `inprocess` block, 8 in a block that leaves it out.",
        "maxQueuedLaunches": "Launches that may wait for a pool slot; one more is refused (`QUEUE_FULL`) and creates "
                             "nothing.",
        "launchQueueTimeoutMs": "How long a queued launch waits for a pool slot before it is refused (`QUEUE_TIMEOUT`).",
        "startTimeoutMs": "Accepted for compatibility with the original's settings; the pool's start timeout is "
                          "fixed at 15 s today, so the value is not used.",
    },
)
SUPERVISION_SPEC: Final = Obj(
    {
        "maxRestarts": Int(minimum=0, maximum=1000, default=3),
        "restartPeriodMs": _ms(60_000),
        "backoffBaseMs": _ms(100, minimum=0),
        "backoffCapMs": _ms(5_000, minimum=0),
        "forceRpc": Bool(default=False),
        "rpcIdleGraceMs": Int(minimum=-1, maximum=_MS_MAX, default=RPC_IDLE_GRACE_MS, unit="ms (-1: never)"),
    },
    what="supervision",
    docs={
        "maxRestarts": "Restarts one supervisor allows in `restartPeriodMs`; one more stops its children and "
                       "escalates to its parent (at the top the run ends with exit status 3).",
        "restartPeriodMs": "The window `maxRestarts` is counted in.",
        "backoffBaseMs": "The first restart in a window is immediate; later ones wait this long, doubling each time.",
        "backoffCapMs": "The longest wait between two restarts.",
        "forceRpc": "Run every session in its own rpc worker process instead of the shared in-process pool (by "
                    "default only a launch with a git worktree does).",
        "rpcIdleGraceMs": "A session in its own rpc worker process whose run has settled gives the process back "
                          "after this long without new input: the process exits, the node keeps its status, and "
                          "new input (mail, a notice, steer, continue, resume) starts it again from its transcript. "
                          "Not a restart: it counts toward no restart limit. -1 keeps the process until the run ends.",
    },
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
                docs={
                    "role": "The card (role) the member runs. Required.",
                    "name": "The member's node name in the team. Default: the role.",
                    "model": "The member's model, `provider/model-id[:thinking]`; stronger than the card's own.",
                    "preset": "A preset (`presets.<name>`) for the member's model and thinking.",
                    "thinking": "The member's thinking level (`off`, `minimal`, `low`, `medium`, `high`, `xhigh`), "
                                "or `false` to strip one.",
                },
            ),
        ),
    ),
    expected="a role name or a member object {role, name, model, preset, thinking}",
)
TEAM_SPEC: Final = Obj(
    {"members": ListOf(MEMBER_SPEC), "description": Str(nonempty=False)},
    what="a team",
    docs={
        "members": "The roster: each a role name, or an object naming the role and the member's name, model, "
                   "preset or thinking.",
        "description": "One line shown by `legion team`.",
    },
)
PRESET_SPEC: Final = Obj(
    {
        "kind": Str(choices=KINDS),
        "model": _model,
        "thinking": Custom(check_thinking),
        "description": Str(nonempty=False),
    },
    what="a preset",
    docs={
        "kind": "The session kind: `native` (legion's own session) or `pi` (the pi CLI).",
        "model": "The preset's model, `provider/model-id[:thinking]`.",
        "thinking": "The preset's thinking level (`off` … `xhigh`), or `false` to strip one.",
        "description": "One line saying what the preset is for.",
    },
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
        "loopNoticeMs": Int(minimum=0, maximum=_MS_MAX, unit="ms (0 disables)"),
        "toolBudget": Int(minimum=1, maximum=100_000),
        "turnBudget": Int(minimum=1, maximum=100_000),
        "restart": Str(choices=RESTART_TYPES),
        "maxRestarts": Int(minimum=0, maximum=1000),
        "restartPeriodMs": Int(minimum=1, maximum=_MS_MAX, unit="ms"),
    },
    what="an agent override",
    docs={
        "model": "The role's model, `provider/model-id[:thinking]` (or `inherit`: the parent's); replaces the "
                 "card's `model`.",
        "thinking": "The role's thinking level (`off` … `xhigh`), or `false` to strip one.",
        "preset": "A preset (`presets.<name>`) for the role.",
        "disabled": "`true`: the card cannot be launched and `legion agents` hides it (`--all` shows it).",
        "fallbackModels": "Models tried in order when the role's model cannot be used at all (unknown provider, "
                          "missing key, authentication refused, a model the provider does not serve) before it "
                          "produced anything (a `native` session; pi picks its own); replaces the card's `fallbackModels`.",
        "loopNoticeMs": "The role's long-running notice radius (see `legion.loopNoticeMs`); 0 turns it off.",
        "tools": "The tools the role may use (a list or a comma-separated string); replaces the card's `tools`.",
        "timeoutMs": "The card's `timeoutMs` for the role; accepted, not enforced yet.",
        "toolTimeoutMs": "How long one tool call of the role may run before it is stopped (default 600 s).",
        "toolBudget": "Tool calls the role's session may make.",
        "turnBudget": "Model turns the role's session may take.",
        "restart": "When the role's session is restarted after it exits: `permanent` always, `transient` only "
                   "after an abnormal exit, `temporary` never.",
        "maxRestarts": "Restarts the role's session may have in `restartPeriodMs`.",
        "restartPeriodMs": "The window the role's `maxRestarts` is counted in.",
    },
)
BY_PROVIDER_SPEC: Final = MapOf(
    MapOf(
        Obj({"model": _model}, what="a provider-scoped override (model only)", required=("model",),
            docs={"model": "The role's model when its parent runs on this provider (`agentOverridesByProvider."
                           "<provider>.<role>.model`); stronger than `agentOverrides.<role>.model`. Required."}),
        key=_slug,
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
                        docs={"input": "USD per million input tokens.",
                              "output": "USD per million output tokens.",
                              "cacheRead": "USD per million tokens read from the prompt cache.",
                              "cacheWrite": "USD per million tokens written to the prompt cache."},
                    ),
                },
                what="a provider model",
                required=("id",),
                docs={
                    "id": "The model id the endpoint knows (`provider/<id>` in a model string). Required.",
                    "name": "A display name.",
                    "contextWindow": "The model's context window in tokens.",
                    "maxTokens": "The most output tokens one call may ask for.",
                    "reasoning": "`true`: the model takes a thinking level.",
                    "cost": "The model's price in USD per million tokens; overrides genai-prices (give a free "
                            "local model 0). Unset (and unknown to genai-prices): the cost is recorded as unknown.",
                },
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
    docs={
        "baseUrl": "The endpoint's URL (e.g. `http://localhost:8000/v1` for vLLM). Default for a known "
                   "provider: its URL (`ANTHROPIC_BASE_URL` / `OPENAI_BASE_URL` when set).",
        "apiKey": "The environment variable holding the key (pi's field), e.g. `VLLM_API_KEY`.",
        "apiKeyEnv": "The same as `apiKey`, by a clearer name.",
        "apiKeyLiteral": "The key itself; prefer a variable (`apiKey`), so the key stays out of files.",
        "api": "The wire protocol: `openai-completions` (chat completions) or `anthropic-messages`.",
        "headers": "Extra HTTP headers sent with every request.",
        "timeoutMs": "A request's read timeout: how long to wait for the endpoint's next bytes (default 120 s; "
                     "connecting: 10 s).",
        "maxRetries": "Retries of a 429, 5xx, 529 overloaded or connection error, with backoff and "
                      "`Retry-After` (default 2).",
        "models": "The endpoint's models: each an id, or an object with its id, name, limits and cost.",
    },
)
SETTINGS_SPEC: Final = Obj(
    {
        "enabled": Bool(default=True),
        "legion": LEGION_SPEC,
        "inprocess": INPROCESS_SPEC,
        "supervision": SUPERVISION_SPEC,
        "defaultModel": Str(validate=_concrete_model),
        "team": _slug,
        # the working directories a launch's `cwd` may name besides its caller's own (exact, no subdirectories):
        # docs/spec-conformance.md §11, `legion.agents.cwd_admission`
        EXTERNAL_DIRECTORIES: ListOf(Str(validate=_external_directory), unique=True),
        "teams": MapOf(TEAM_SPEC, key=_slug),
        "presets": MapOf(PRESET_SPEC, key=_slug),
        "agentOverrides": MapOf(OVERRIDE_SPEC, key=_slug),
        "agentOverridesByProvider": BY_PROVIDER_SPEC,
        "providers": MapOf(PROVIDER_SPEC, key=_provider_name),
        "retentionDays": Int(minimum=0, maximum=3650, default=14, unit="days"),
        "eventRetentionDays": Int(minimum=1, maximum=3650, default=30, unit="days"),
        "eventMaxRows": Int(minimum=1000, maximum=100_000_000, default=200_000),
    },
    what="settings",
    docs={
        "enabled": "`false` refuses new launches only; status, collect, wait, stop and the other control "
                   "actions keep working.",
        "legion": "The tree's limits, timeouts and budget.",
        "inprocess": "The in-process session pool: its slots and admission queue.",
        "supervision": "Restart intensity and backoff of the supervision tree, and where sessions run.",
        "defaultModel": "The root session's model, `provider/model-id[:thinking]`, when neither `--model` nor "
                        "the root card names one; also the model of a card without one. Unset: the first "
                        "provider whose key variable is set, with legion's default model for it.",
        "team": "The active team (a key of `teams`); the `LEGION_TEAM` environment variable overrides it. "
                "Unset: `default` (every enabled card).",
        "externalDirectories": "Directories a launch's `cwd` may name besides its caller's own working directory "
                               "and the run's team worktrees: absolute paths (`~`, `$HOME` and `${HOME}` "
                               "expand), each admitted exactly, not its subdirectories; one that does not exist "
                               "admits nothing. Unset: none.",
        "teams": "Named rosters of roles, one of which is active (`team`, `LEGION_TEAM`, `legion run --team`).",
        "presets": "Named model presets (kind, model, thinking) a card, team member or `--preset` can pick.",
        "agentOverrides": "Per role (card name): values that replace the card's own.",
        "agentOverridesByProvider": "Per provider of the parent's model, per role: the model to use.",
        "providers": "Model endpoints besides the built-in `anthropic` and `openai` (vLLM, llama.cpp, Ollama, "
                     "OpenRouter, a proxy), by provider name, in the shape of pi's `models.json`. An entry named "
                     "after a known provider (`anthropic`, `openai`, `openrouter`, `groq`, `xai`, `cerebras`, "
                     "`mistral`) takes its URL and key variable unless it sets them.",
        "retentionDays": "A run's startup housekeeping removes run directories idle this many days; 0 keeps "
                         "every run.",
        "eventRetentionDays": "Accepted for compatibility with the original's settings; a run does not trim its "
                              "ledger's events yet, so the value is not used.",
        "eventMaxRows": "Accepted for compatibility with the original's settings; a run does not trim its "
                        "ledger's events yet, so the value is not used.",
    },
)


class SettingKey(NamedTuple):
    """One settings key as docs/settings.md lists it."""

    path: str  # dotted; `<name>` a key the user chooses, `[]` each item of a list
    kind: str  # what it accepts, e.g. "integer between 1 and 64"
    default: Any  # None: no default
    description: str


def settings_reference() -> list[SettingKey]:
    """Every settings key with its type, default and description (docs/settings.md, `legion init`, doctor)."""
    return [
        SettingKey(path, type_name(spec),
                   INPROCESS_MAX_ACTIVE_WITHOUT_BLOCK if path == "inprocess.maxActive" else spec.defaults(), doc)
        for path, spec, doc in keys(SETTINGS_SPEC)
    ]
