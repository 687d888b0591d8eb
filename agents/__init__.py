"""Role cards, settings, teams, presets and model resolution (the definition layer).

Public API (others code against these names; see each module's docstring for details):

- cards:    `load_catalog(cwd, env=…, settings=…)` → `Catalog`; `AgentConfig`; `parse_card(bytes, path=…)`
- settings: `load_settings(cwd, env=…)` → `Settings` (`.get`, `.is_explicit`, `.phase_timeout_ms`, …)
- teams:    `active_team`, `team_for_launch`, `require_team`, `team_env`, `team_column`
- presets:  `require_preset`
- models:   `resolve_model(agent, settings, request=ModelRequest(...), parent_model=…)` → `ModelResolution`;
            `model_label`, `split_thinking_suffix` (modelspec), `ModelRegistry` (registry),
            `replay_pin`, `pin_for_candidate` (pins), `check_model_scope`, `warning_lines` (scope)
- verdict:  `parse_verdict(text)` / `find_verdict(text)` → `Verdict`
- listing:  `list_agents(cwd, scope)` → `[AgentRow]`, `NEEDS_PARENT_MODEL`
- guards:   `check_launch_enabled`, `check_centurion_dispatch`, `phases_for_launch`, `worktree_for_launch`,
            `backend_for_launch`, `LaunchRefused` (docs/spec-conformance.md §2.3 checks that concern cards);
            `admit_cwd` (a launch's working directory: `CWD_NOT_ALLOWED`, docs/spec-conformance.md §11)
- launch:   `compose_system_prompt(agent, cwd=…)`, `child_budget(agent, settings, child_depth=…)`,
            `phase_timeouts_ms(machine, settings)`,
            `restart_policy(agent, settings)`
- phases:   `validate_phases`, `phases_or_warning` → `PhaseDeclaration` (load-time checks of a declaration)
- errors:   `AgentDefinitionError` and its subclasses

Nothing here reads `os.environ` except `locations.process_env()`, used only when a caller passes
no `env` (root-process callers). Pooled sessions pass their own env mapping.
"""

from legion.agents.budget import (
    MAX_DEPTH_CEILING,
    ChildBudget,
    RestartPolicy,
    child_budget,
    depth_cap,
    phase_timeouts_ms,
    restart_policy,
)
from legion.agents.card import Acceptance, AgentConfig, Criterion, parse_card
from legion.agents.catalog import Catalog, builtin_card_files, load_catalog
from legion.agents.cwd_admission import CWD_NOT_ALLOWED, admit_cwd
from legion.agents.errors import (
    AgentDefinitionError,
    CardError,
    CatalogError,
    ModelResolutionError,
    PresetError,
    SettingsError,
    TeamError,
    UnknownFieldError,
    VerdictError,
)
from legion.agents.fields import CARD_FIELDS, FIELD_GROUPS, KINDS, KNOWN_TOOLS, card_reference
from legion.agents.guards import (
    LaunchRefused,
    WarnOnce,
    backend_for_launch,
    check_centurion_dispatch,
    check_launch_enabled,
    phases_for_launch,
    worktree_for_launch,
)
from legion.agents.listing import NEEDS_PARENT_MODEL, AgentRow, format_rows, list_agents
from legion.agents.locations import process_env, project_agents_dir, project_settings_path, user_config_dir
from legion.agents.models import (
    ModelCandidate,
    ModelRequest,
    ModelResolution,
    model_chain,
    resolve_model,
    step_request,
    validate_request,
)
from legion.agents.modelspec import INHERIT, THINKING_LEVELS, model_label, provider_of, split_thinking_suffix
from legion.agents.phases import (
    PHASE_CONDITIONS,
    PhaseDeclaration,
    phases_or_warning,
    validate_phases,
)
from legion.agents.pins import PinDecision, pin_for_candidate, provider_for_model, replay_pin
from legion.agents.presets import require_preset
from legion.agents.prompt import BASE_PROMPT, PromptParts, compose_system_prompt, project_context_files
from legion.agents.registry import ModelRegistry
from legion.agents.scope import ScopeCheck, check_model_scope, classify_model_origin, warning_lines
from legion.agents.settings import (
    DEFAULT_TEAM,
    PHASE_TIMEOUTS_MS,
    InprocessLimits,
    LegionLimits,
    Preset,
    ProviderConfig,
    Retention,
    Settings,
    SupervisionSettings,
    Team,
    TeamMember,
    build_settings,
    load_settings,
    parse_settings_bytes,
)
from legion.agents.settings_schema import settings_reference
from legion.agents.teams import (
    TEAM_ENV,
    TeamSelection,
    active_team,
    require_team,
    team_column,
    team_env,
    team_for_launch,
)
from legion.agents.verdict import Verdict, VerdictIssue, find_verdict, format_verdict, parse_verdict

__all__ = [
    "BASE_PROMPT",
    "CARD_FIELDS",
    "CWD_NOT_ALLOWED",
    "DEFAULT_TEAM",
    "FIELD_GROUPS",
    "INHERIT",
    "KINDS",
    "KNOWN_TOOLS",
    "MAX_DEPTH_CEILING",
    "NEEDS_PARENT_MODEL",
    "PHASE_CONDITIONS",
    "PHASE_TIMEOUTS_MS",
    "TEAM_ENV",
    "THINKING_LEVELS",
    "Acceptance",
    "AgentConfig",
    "AgentDefinitionError",
    "AgentRow",
    "CardError",
    "Catalog",
    "CatalogError",
    "ChildBudget",
    "Criterion",
    "InprocessLimits",
    "LaunchRefused",
    "LegionLimits",
    "ModelCandidate",
    "ModelRegistry",
    "ModelRequest",
    "ModelResolution",
    "ModelResolutionError",
    "PhaseDeclaration",
    "PinDecision",
    "Preset",
    "PresetError",
    "PromptParts",
    "ProviderConfig",
    "RestartPolicy",
    "Retention",
    "ScopeCheck",
    "Settings",
    "SettingsError",
    "SupervisionSettings",
    "Team",
    "TeamError",
    "TeamMember",
    "TeamSelection",
    "UnknownFieldError",
    "Verdict",
    "VerdictError",
    "VerdictIssue",
    "WarnOnce",
    "active_team",
    "admit_cwd",
    "backend_for_launch",
    "build_settings",
    "builtin_card_files",
    "card_reference",
    "check_centurion_dispatch",
    "check_launch_enabled",
    "check_model_scope",
    "child_budget",
    "classify_model_origin",
    "compose_system_prompt",
    "depth_cap",
    "find_verdict",
    "format_rows",
    "format_verdict",
    "list_agents",
    "load_catalog",
    "load_settings",
    "model_chain",
    "model_label",
    "parse_card",
    "parse_settings_bytes",
    "parse_verdict",
    "phase_timeouts_ms",
    "phases_for_launch",
    "phases_or_warning",
    "pin_for_candidate",
    "process_env",
    "project_agents_dir",
    "project_context_files",
    "project_settings_path",
    "provider_for_model",
    "provider_of",
    "replay_pin",
    "require_preset",
    "require_team",
    "resolve_model",
    "restart_policy",
    "settings_reference",
    "split_thinking_suffix",
    "step_request",
    "team_column",
    "team_env",
    "team_for_launch",
    "user_config_dir",
    "validate_phases",
    "validate_request",
    "warning_lines",
    "worktree_for_launch",
]
