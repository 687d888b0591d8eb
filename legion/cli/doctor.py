"""`legion doctor [SECTION]`: checks that this machine and project can host a run, each with a fix (the sections
beyond `machine` are in `legion.cli.doctor_sections`)."""

from __future__ import annotations

import argparse
import ctypes
import os
import sqlite3
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from legion.paths import project_dir, runs_dir
from legion.procs import containment
from legion.procs.cgroup import create_run_cgroup
from legion.workers.tree_budget import UNKNOWN_COST_USD_PER_MTOK, UNPRICED_HINT

# sun_path in sockaddr_un is 108 bytes including the terminating NUL.
UNIX_SOCKET_PATH_MAX = 107
# The longest socket name a run directory holds (`ctl.sock`, `mon.sock`, `snap.sock`).
LONGEST_SOCKET_NAME = "/snap.sock"
# A run id is a timestamp plus a short random suffix; leave room for it.
RUN_ID_ROOM = len("/20261130-063700-abcdef")


def add_parser(sub: Any) -> None:
    from legion.cli.doctor_sections import SECTIONS

    p = sub.add_parser("doctor", help="check that this machine and project can host a run")
    p.add_argument("section", nargs="?", choices=list(SECTIONS),
                   help="one section (default: machine): summary, machine, models = configured providers, key "
                        "presence and each card's model, spawn, memory, tools, storage, runtime = a live run's "
                        "workers, heartbeats and cgroup, errors = the newest run's failures, next = what to fix")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    from legion.cli.app import build_parser, command_names
    from legion.cli.common import print_json
    from legion.cli.doctor_sections import section

    checks = section(args.section or "machine", Path(args.cwd).resolve(), command_names(build_parser()))
    if args.json:
        print_json(as_dicts(checks))
    else:
        print(render(checks))
    return exit_code(checks)


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # "ok" | "warn" | "fail" | "off" (not usable here and not needed: not a problem, not a ✓ either)
    detail: str
    fix: str = ""


def check_python() -> Check:
    """Informational: the package itself requires Python ≥ 3.11 to install."""
    version = ".".join(map(str, sys.version_info[:3]))
    return Check("python", "ok", f"Python {version} at {sys.executable}")


def check_sqlite_wal(where: Path) -> Check:
    """A file database in the project's runs folder must really switch to WAL (docs/spec-conformance.md §4.1)."""
    probe_dir = _nearest_existing(where)
    try:
        with tempfile.TemporaryDirectory(dir=probe_dir) as tmp:
            con = sqlite3.connect(Path(tmp) / "probe.db")
            try:
                mode = con.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            finally:
                con.close()
    except OSError as exc:
        return Check("sqlite-wal", "fail", f"cannot create a database under {probe_dir}: {exc}",
                     "run legion from a writable directory")
    detail = f"SQLite {sqlite3.sqlite_version}, journal_mode={mode} under {probe_dir}"
    if mode == "wal":
        return Check("sqlite-wal", "ok", detail)
    return Check("sqlite-wal", "fail", detail,
                 "this filesystem cannot hold a WAL database (network/FUSE mount?); "
                 "run from a local disk")


def _nearest_existing(path: Path) -> Path:
    """The filesystem that will hold `path`: its nearest existing ancestor."""
    path = path.resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_zmq() -> Check:
    try:
        import zmq
    except ImportError as exc:  # pragma: no cover - a broken install
        return Check("zeromq", "fail", f"pyzmq is not importable: {exc}", "reinstall legion")
    missing = [cap for cap in ("ipc", "curve") if not zmq.has(cap)]
    detail = f"libzmq {zmq.zmq_version()}, pyzmq {zmq.pyzmq_version()}"
    if missing:
        return Check("zeromq", "fail", f"{detail}; missing capabilities: {', '.join(missing)}",
                     "install a pyzmq wheel built with libsodium and ipc support")
    return Check("zeromq", "ok", f"{detail}; ipc and curve available")


def check_socket_path(cwd: Path) -> Check:
    """`ipc://` endpoints live in the run directory; a deep project path can exceed sun_path."""
    longest = len(str(runs_dir(cwd).resolve())) + RUN_ID_ROOM + len(LONGEST_SOCKET_NAME)
    detail = f"longest ipc socket path ≈ {longest} bytes (limit {UNIX_SOCKET_PATH_MAX})"
    if longest <= UNIX_SOCKET_PATH_MAX:
        return Check("ipc-path", "ok", detail)
    return Check("ipc-path", "warn", detail,
                 "run from a shorter project path, or bind tcp:// endpoints with CurveZMQ keys")


def check_subreaper() -> Check:
    """Orphaned grandchildren must re-parent to the root so a retire can still find them."""
    if not sys.platform.startswith("linux"):
        return Check("subreaper", "warn", f"{sys.platform}: no PR_SET_CHILD_SUBREAPER",
                     "run on Linux for verified process-tree sweeps")
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        value = ctypes.c_int(0)
        pr_get_child_subreaper = 37
        if libc.prctl(pr_get_child_subreaper, ctypes.byref(value), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl failed")
    except OSError as exc:
        return Check("subreaper", "warn", f"prctl unavailable: {exc}",
                     "orphaned grandchildren may escape a sweep")
    return Check("subreaper", "ok", "PR_SET_CHILD_SUBREAPER available")


def check_containment() -> Check:
    """Which containment a run started here will use (docs/architecture.md §3).

    cgroup v2 where allowed, else the pid/pgid ladder."""
    decision = containment()
    if not decision.cgroups:
        return Check("containment", "warn", f"pid/pgid retire ladder: {decision.reason}",
                     "run as root or in a delegated cgroup v2 subtree (systemd-run --user -p Delegate=yes) for "
                     "cgroup containment; without it a process a descendant starts from its TERM handler "
                     "during a sweep may escape")  # fmt: skip
    assert decision.parent is not None
    try:
        probe = create_run_cgroup(decision.parent)
    except OSError as exc:
        return Check("containment", "warn", f"pid/pgid retire ladder: a run cgroup cannot be created: {exc}",
                     "use Linux ≥ 5.14 (cgroup.kill) with a writable cgroup v2 subtree")
    probe.remove()
    return Check("containment", "ok", f"cgroups: {decision.reason}")


def check_pidfd() -> Check:
    if hasattr(os, "pidfd_open"):
        try:
            fd = os.pidfd_open(os.getpid())
            os.close(fd)
            return Check("pidfd", "ok", "pidfd_open available (exit detection without polling)")
        except OSError as exc:
            return Check("pidfd", "warn", f"pidfd_open failed: {exc}", "exits are detected by polling")
    return Check("pidfd", "warn", "os.pidfd_open missing", "exits are detected by polling")


def check_project(cwd: Path) -> Check:
    folder = project_dir(cwd).resolve()
    if folder.is_dir():
        return Check("project", "ok", f"{folder} exists")
    return Check("project", "ok", f"{folder} does not exist yet (created on first run or by `legion init`)")


def run_checks(cwd: Path) -> list[Check]:
    """Every check, in display order; none raises."""
    checks: list[Callable[[], Check]] = [
        check_python,
        lambda: check_sqlite_wal(runs_dir(cwd)),
        check_zmq,
        lambda: check_socket_path(cwd),
        check_subreaper,
        check_containment,
        check_pidfd,
        lambda: check_project(cwd),
    ]
    results = []
    for check in checks:
        try:
            results.append(check())
        except Exception as exc:  # a doctor reports; it never crashes
            results.append(Check(getattr(check, "__name__", "check"), "fail", f"check crashed: {exc!r}"))
    return results


def as_dicts(checks: list[Check]) -> list[dict[str, str]]:
    return [asdict(c) for c in checks]


def render(checks: list[Check]) -> str:
    marks = {"ok": "✓", "warn": "⚠", "fail": "✗", "off": "–"}
    lines = []
    for c in checks:
        lines.append(f"{marks.get(c.status, '?')} {c.name:<11} {c.detail}")
        if c.fix and c.status not in ("ok", "off"):
            lines.append(f"  fix: {c.fix}")
    return "\n".join(lines)


def exit_code(checks: list[Check]) -> int:
    return 1 if any(c.status == "fail" for c in checks) else 0


# ---- `legion doctor models` --------------------------------------------------------------------

def _key_state(settings: Any, env: Mapping[str, str]) -> tuple[str, bool]:
    """How a provider's key stands, without ever showing the key: (description, usable)."""
    if settings.key_literal:
        return "a literal key is configured (apiKeyLiteral)", True
    if not settings.key_env:
        return "no key needed (none configured)", True
    value = env.get(settings.key_env)
    if value is None:
        return f"{settings.key_env} is not set", False
    if not value.strip():
        return f"{settings.key_env} is set but empty", False
    return f"{settings.key_env} is set", True


def _provider_check(settings: Any, env: Mapping[str, str], used: bool) -> Check:
    state, usable = _key_state(settings, env)
    detail = f"{settings.api} at {settings.url(env)}; key: {state}; from {settings.source}"
    if usable:
        return Check(f"provider {settings.name}", "ok", detail)
    if not used:  # not a problem (nothing needs it), but not ✓: it cannot be used as it stands
        return Check(f"provider {settings.name}", "off", detail + " (no card uses it)",
                     f"export {settings.key_env}=… to use it")
    return Check(f"provider {settings.name}", "warn", detail,
                 f"export {settings.key_env}=… in the environment legion runs in")


def _card_check(row: Any, registry: Any, env: Mapping[str, str]) -> Check:
    name = f"card {row.name}"
    if row.source in ("error", "warning"):
        return Check(name, "warn", row.note or "broken card")
    detail = f"{row.model} ({row.origin})" + (f" — {row.note}" if row.note else "")
    if "/" not in row.model:
        return Check(name, "ok", detail)
    try:
        _provider, ref = registry.resolve(row.model)
    except Exception as exc:  # ProviderError: unknown provider or model
        return Check(name, "fail", f"{detail}: {exc}", "fix the model in the card, settings or models.json")
    settings = registry.settings.get(ref.provider)
    if settings is not None and not _key_state(settings, env)[1]:
        return Check(name, "warn", f"{detail}; {_key_state(settings, env)[0]}",
                     f"export {settings.key_env}=… before a run uses this card")
    if settings is not None and _unpriced(settings, ref, env):
        detail += (f"; price unknown (neither settings nor genai-prices know it): reports show its cost as "
                   f"unknown and a cost budget counts its tokens at legion.budget.unknownCostPerMTokUsd "
                   f"(${UNKNOWN_COST_USD_PER_MTOK:g}/Mtok unless set); "
                   + UNPRICED_HINT.replace("<name>", ref.provider))
    return Check(name, "ok", detail)


def _unpriced(settings: Any, ref: Any, env: Mapping[str, str]) -> bool:
    from legion.workers.providers.pricing import cost_usd

    override = settings.model(ref.model_id).get("cost")
    return cost_usd(ref.provider, ref.model_id, override, input=1_000_000, output=0, base_url=settings.url(env)) is None


def model_checks(cwd: Path, env: Mapping[str, str] | None = None) -> list[Check]:
    """Every configured provider (built in, settings, pi's models.json), whether its key is present —
    never the key itself — and each card's effective model; none raises."""
    env = os.environ if env is None else env
    try:
        from legion.agents import list_agents, load_settings
        from legion.workers.providers.pi_models import load_pi_models
        from legion.workers.providers.registry import ProviderRegistry

        settings = load_settings(cwd, env=env)
        pi = load_pi_models(env=env)
        registry = ProviderRegistry(settings.data.get("providers", {}), pi_models=pi)
        rows = list_agents(cwd, env=env, settings=settings)
    except Exception as exc:  # settings or provider configuration errors name their own fix
        return [Check("models", "fail", f"cannot load the model configuration: {exc}")]
    used = {row.model.partition("/")[0] for row in rows if "/" in row.model}
    checks = [Check("pi models", "ok", f"{pi.path} ({'found' if pi.path and pi.path.is_file() else 'absent'}, "
                                       f"{len(pi.providers)} provider(s))")]
    checks += [Check("pi models", "warn", problem, "fix the file; pi will not read it either")
               for problem in pi.problems]
    checks += [Check(f"provider {name}", "fail", problem, f"fix providers.{name} in {pi.path}")
               for name, problem in sorted(pi.broken.items())]
    checks += [_provider_check(s, env, name in used) for name, s in sorted(registry.settings.items())]
    checks += [_card_check(row, registry, env) for row in rows]
    return checks
