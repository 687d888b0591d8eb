"""Everything `legion run` checks before a run exists (exit 2, nothing created), without the run machinery.

`prepare_run(options)` loads settings and cards, resolves the root session's model and checks the run's
arguments; only then does `legion.orchestration.run.execute` make the run directory and start the supervisor
(README "Running a task": "Before a run starts"). It imports no supervision code, so a refusal is fast.

The root's model: `--model`, else what a launch resolves for the root card (preset, team member,
`agentOverrides`, the card's `model:`, `defaultModel` in settings), else the first built-in provider whose
key variable is set, with its documented default model (`DEFAULT_MODELS`). The choice and its reason are
`Prepared.model_note`, the run's first line on stderr.
"""

from __future__ import annotations

import math
import os
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from legion.agents import AgentDefinitionError, Catalog, Settings, load_catalog, load_settings
from legion.paths import runs_dir
from legion.run_errors import RunConfigError
from legion.run_ledger import LedgerChoice, check_ledger, choose_ledger
from legion.runs import DAEMON_FILES

if TYPE_CHECKING:
    from legion.bus.security import CurveServerConfig

# provider, its key variable, the model a run uses when nothing names one (README "Choosing a model")
DEFAULT_MODELS: Final = (
    ("anthropic", "ANTHROPIC_API_KEY", "anthropic/claude-sonnet-4-5"),
    ("openai", "OPENAI_API_KEY", "openai/gpt-4.1"),
)
RUN_ID: Final = re.compile(r"[A-Za-z0-9._-]{1,128}")
NO_MODEL: Final = (
    "no model is configured for the root session and no provider key is set. Pass one with "
    "`--model PROVIDER/ID` (e.g. --model anthropic/claude-sonnet-4-5, or --model scripted/echo to try legion "
    'without a key), set "defaultModel" in .legion/settings.json, or set ANTHROPIC_API_KEY or OPENAI_API_KEY. '
    "`legion doctor models` shows every provider, its key and each card's model"
)


@dataclass
class RunOptions:
    task: str
    cwd: Path
    agent: str = "root"
    model: str | None = None
    team: str | None = None
    preset: str | None = None
    run_id: str | None = None
    timeout: float | None = None
    max_cost: float | None = None
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    monitor_tcp: tuple[str, str] | None = None  # (PUB, snapshot) tcp:// endpoints; needs curve
    curve: CurveServerConfig | None = None
    ledger: str | None = None  # `legion run --ledger URL` (legion/run_ledger.py)


@dataclass
class Prepared:
    options: RunOptions
    settings: Settings
    catalog: Catalog
    run_id: str
    run_dir: Path
    model_note: str = ""  # "model X (why)": the run's first line
    model: str = ""  # the root session's model (provider/model-id[:thinking]): as chosen, or as resumed
    ledger: LedgerChoice | None = None  # a PostgreSQL ledger; None: the run directory's legion.db


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def check_run_id(run_id: str) -> str:
    """A run id is a plain name: it becomes a directory under .legion/runs/, never a path."""
    if not RUN_ID.fullmatch(run_id) or run_id in (".", "..") or run_id.startswith("-"):
        raise RunConfigError(f"--run-id {run_id!r} is not a plain name: use 1-128 letters, digits, '.', '_' and "
                             "'-' (no '/', not '.' or '..', not starting with '-')")  # fmt: skip
    return run_id


def check_positive(flag: str, value: float | None, unit: str) -> None:
    """`--timeout` / `--max-cost`: a finite number above zero (nan would turn the limit off)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise RunConfigError(f"{flag} must be a finite number of {unit} above 0, got {value!r}")


def choose_model(options: RunOptions, settings: Settings, catalog: Catalog) -> tuple[str | None, str, str]:
    """(the model to pass to the root's launch, the model chosen, the line that says which and why).

    None keeps the launch's own resolution (it names a model); a key default is passed explicitly.
    """
    from legion.agents.models import ModelRequest, refusal_message, resolve_model
    from legion.agents.teams import require_team, team_for_launch

    card = catalog.require(options.agent)
    selection = team_for_launch(settings, options.env, launch_team=options.team, card_team=card.team)
    team = require_team(settings, selection.name)
    request = ModelRequest(options.model, None, options.preset)
    chain_empty = False
    try:
        res = resolve_model(card, settings, request=request, member=team.member_for(card.name), team=selection.name)
    except AgentDefinitionError as exc:
        if str(exc) != refusal_message(card.name, "", inherit=False):
            raise
        chain_empty = True
    if not chain_empty:
        why = "--model" if res.level == 1 else res.detail
        return options.model, res.label, f"model {res.label} (from {why})"
    for provider, key_env, model in DEFAULT_MODELS:
        if (options.env.get(key_env) or "").strip():
            return model, model, (f"model {model} (legion's default for {provider}: {key_env} is set and no --model, "
                           f"card model or defaultModel names one)")  # fmt: skip
    raise RunConfigError(NO_MODEL)


def check_model(model: str, settings: Settings, env: Mapping[str, str]) -> None:
    """The model string parses, its provider is known and that provider's key is set (an unknown model id on
    a known provider is left to the first call: servers differ)."""
    from legion.workers.providers.base import ProviderError, parse_model_ref
    from legion.workers.providers.config import ALWAYS_BUILTIN, parse_entry
    from legion.workers.providers.pi_models import load_pi_models

    try:
        ref = parse_model_ref(model)
        if ref.provider == "scripted":
            return
        known = {name: parse_entry(name, {}, source="built in") for name in ALWAYS_BUILTIN}
        pi = load_pi_models(env=env)
        known.update(pi.providers)
        for name, entry in (settings.data.get("providers") or {}).items():
            known[name] = parse_entry(name, entry)
    except ProviderError as exc:
        raise RunConfigError(f"--model / the root's model: {exc}") from None
    provider = known.get(ref.provider)
    if provider is None:
        broken = pi.broken.get(ref.provider)
        if broken:
            raise RunConfigError(f"provider {ref.provider!r} (from pi's models.json) is not usable: {broken}")
        note = f"; pi's models.json was not loaded: {pi.problems[0]}" if pi.problems else ""
        raise RunConfigError(f"unknown provider {ref.provider!r} in model {model!r}; known providers: "
                             f"{', '.join(sorted({*known, 'scripted'}))} (add one under 'providers' in "
                             f".legion/settings.json; `legion doctor models` lists them){note}")  # fmt: skip
    _, problem = provider.key(env)
    if problem:
        raise RunConfigError(f"{problem}; `legion doctor models` shows every provider's key")


def check_run_root(cwd: Path) -> None:
    """The project's `.legion/runs` can take a new run directory: each part of it that exists is a folder this user
    can write, and the first missing one can be made; else a RunConfigError naming the path and the fix."""
    runs = runs_dir(cwd)
    why = ("legion keeps a project's settings, cards and runs in its .legion folder; run legion from a directory "
           "you can write, or")
    for path in (runs.parent, runs):
        if not path.exists() and not path.is_symlink():
            parent = path.parent
            if not os.access(parent, os.W_OK | os.X_OK):
                raise RunConfigError(f"cannot create the run directory: {parent} is not writable, so {path} cannot "
                                     f"be made ({why} make {parent} writable)")
            return
        if not path.is_dir():
            what = "a dangling symlink" if path.is_symlink() and not path.exists() else "a file, not a folder"
            raise RunConfigError(f"cannot create the run directory: {path} is {what} ({why} rename or remove "
                                 f"{path})")
        if not os.access(path, os.W_OK | os.X_OK):
            raise RunConfigError(f"cannot create the run directory: {path} is not writable ({why} make it "
                                 f"writable: chmod u+rwx {path})")


def prepare_run(options: RunOptions) -> Prepared:
    """Everything that can refuse before a run exists: arguments, settings, cards, the root's model, the run id."""
    if not options.task.strip():
        raise RunConfigError("the task is empty; give the task as an argument, '-' to read stdin, or @FILE")
    check_positive("--timeout", options.timeout, "seconds")
    check_positive("--max-cost", options.max_cost, "USD")
    if options.run_id is not None:
        check_run_id(options.run_id)
    check_run_root(options.cwd)  # before the settings: a file named .legion would fail their read, unexplained
    try:
        settings = load_settings(options.cwd, env=options.env)
        catalog = load_catalog(options.cwd, env=options.env, settings=settings)
        catalog.require(options.agent)
        model, chosen, note = choose_model(options, settings, catalog)
    except AgentDefinitionError as exc:
        raise RunConfigError(str(exc)) from None
    if model is not None:
        options.model = model
    check_model(chosen, settings, options.env)
    run_id = options.run_id or new_run_id()
    run_dir = runs_dir(options.cwd) / run_id
    if (run_dir.exists() or run_dir.is_symlink()) and not run_dir.is_dir():
        raise RunConfigError(f"cannot create the run directory: {run_dir} is a file, not a folder; pick another "
                             "--run-id, or rename or remove that file")
    if run_dir.exists() and any(p.name not in DAEMON_FILES for p in run_dir.iterdir()):  # a daemon's own files
        raise RunConfigError(f"run directory {run_dir} exists already; pick another --run-id (or `legion resume`)")
    chosen_ledger = choose_ledger(options.ledger, options.env, settings)
    ledger = check_ledger(*chosen_ledger, run_id) if chosen_ledger is not None else None
    return Prepared(options, settings, catalog, run_id, run_dir, note, chosen, ledger)
