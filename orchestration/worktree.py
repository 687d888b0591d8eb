"""Team worktrees: one git checkout per centurion, kept after retire.

docs/spec-conformance.md §2.7, docs/architecture.md §9.10.

`plan_worktree` makes every refusal check (not a git repository, no commit, tracked changes not committed,
the branch or the directory exists) without creating anything; `create_worktree` then runs
`git worktree add -b legion/<name>-<nonce> <run_dir>/worktrees/<name> HEAD` and the optional
`worktreeBootstrap` shell command (its own timeout; a failure removes the worktree and its branch again).
`gc` removes the worktrees (and with `branches` their branches) of finished runs whose branch is merged.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from legion.ledger.runfile import WORKTREES_DIR

WORKTREES: Final = WORKTREES_DIR
BRANCH_PREFIX: Final = "legion/"
GIT_TIMEOUT_S: Final = 60


class WorktreeError(Exception):
    """A worktree that cannot be made; the message says why and how to fix it."""


@dataclass(frozen=True)
class WorktreePlan:
    repo: Path  # the project's top-level directory
    path: Path
    branch: str
    base: str  # the HEAD sha the worktree starts from


def git(cwd: Path, *args: str, check: bool = True, timeout: float = GIT_TIMEOUT_S) -> str:
    """Run git; its stdout (stripped). A failure raises WorktreeError with git's own message."""
    try:
        proc = subprocess.run(["git", *args], cwd=str(cwd), capture_output=True, text=True, timeout=timeout,
                              check=False, env=_git_env())
    except FileNotFoundError:
        raise WorktreeError("git is not installed (worktrees need git on PATH)") from None
    except subprocess.TimeoutExpired:
        raise WorktreeError(f"`git {' '.join(args)}` did not finish in {timeout:.0f} s") from None
    if check and proc.returncode != 0:
        raise WorktreeError(f"`git {' '.join(args)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout.strip()


def _git_env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env.setdefault("GIT_TERMINAL_PROMPT", "0")
    for key in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):  # the project decides, not an inherited hook env
        env.pop(key, None)
    return env


def branch_nonce(run_id: str) -> str:
    """Six hex characters per run: a relaunch under the same name in the same run finds its branch taken."""
    return hashlib.sha256(run_id.encode()).hexdigest()[:6]


def plan_worktree(project: Path, run_dir: Path, run_id: str, name: str) -> WorktreePlan:
    """Every refusal check of a centurion's worktree, creating nothing."""
    inside = git(project, "rev-parse", "--is-inside-work-tree", check=False)
    if inside != "true":
        raise WorktreeError(f"the project {project} is not a git repository: a centurion works in a git worktree. "
                            "Run `git init` and commit, or launch the work without a centurion")
    repo = Path(git(project, "rev-parse", "--show-toplevel"))
    base = git(repo, "rev-parse", "--verify", "--quiet", "HEAD^{commit}", check=False)
    if not base:
        raise WorktreeError(f"the git repository {repo} has no commit yet: a worktree starts from HEAD. "
                            "Make a first commit (`git commit --allow-empty -m init`)")
    dirty = git(repo, "diff", "--name-only", "HEAD")  # staged or not: tracked files that differ from HEAD
    if dirty:
        files = ", ".join(dirty.splitlines()[:5])
        raise WorktreeError(f"the project {repo} has uncommitted changes to tracked files ({files}): the team's "
                            "worktree starts from HEAD and would not see them. Commit or stash them first")
    branch = f"{BRANCH_PREFIX}{name}-{branch_nonce(run_id)}"
    if git(repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False):
        raise WorktreeError(f"the branch {branch} exists already (an earlier team of this run?): pick another "
                            f"name, or delete the branch (`git branch -D {branch}`) if its work is not needed")
    path = run_dir / WORKTREES / name
    if path.exists():
        raise WorktreeError(f"the worktree directory {path} exists already: pick another name for the centurion")
    return WorktreePlan(repo=repo, path=path, branch=branch, base=base)


def create_worktree(plan: WorktreePlan) -> None:
    """`git worktree add -b <branch> <path> <base>`, and its record `<path>.json` beside it."""
    plan.path.parent.mkdir(parents=True, exist_ok=True)
    git(plan.repo, "worktree", "add", "-q", "-b", plan.branch, str(plan.path), plan.base)
    record = {"path": str(plan.path), "branch": plan.branch, "base": plan.base, "repo": str(plan.repo)}
    _record_path(plan.path).write_text(json.dumps(record) + "\n", encoding="utf-8")


def _record_path(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def team_worktree(run_dir: Path, name: str) -> WorktreePlan | None:
    """The worktree record of team `name` in this run (None: the node has no worktree)."""
    record = _record_path(run_dir / WORKTREES / name)
    if not os.path.exists(record):  # most nodes (asked at every launch: no failed open and its exception)
        return None
    try:
        raw = json.loads(record.read_text(encoding="utf-8"))
        return WorktreePlan(repo=Path(raw["repo"]), path=Path(raw["path"]), branch=str(raw["branch"]),
                            base=str(raw["base"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remove_worktree(plan: WorktreePlan) -> None:
    """Undo a worktree whose launch failed after it was made (its branch holds no work yet)."""
    git(plan.repo, "worktree", "remove", "--force", str(plan.path), check=False)
    git(plan.repo, "branch", "-D", plan.branch, check=False)
    _record_path(plan.path).unlink(missing_ok=True)


def branch_head(worktree: Path, branch: str) -> str | None:
    """The sha `branch` points at (None when it does not exist)."""
    return git(worktree, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}^{{commit}}", check=False) or None


# ----- gc ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GcItem:
    run_dir: Path
    path: Path
    branch: str | None
    action: str  # remove | keep
    why: str


def default_branch(repo: Path) -> str | None:
    """origin's HEAD, else main or master, else the checked-out branch."""
    ref = git(repo, "symbolic-ref", "--quiet", "--short", "refs/remotes/origin/HEAD", check=False)
    if ref:
        return ref
    for name in ("main", "master"):
        if git(repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{name}", check=False):
            return name
    return git(repo, "symbolic-ref", "--quiet", "--short", "HEAD", check=False) or None


def _worktree_branches(repo: Path) -> dict[Path, str | None]:
    found: dict[Path, str | None] = {}
    current: Path | None = None
    for line in git(repo, "worktree", "list", "--porcelain").splitlines():
        if line.startswith("worktree "):
            current = Path(line[len("worktree "):]).resolve()
            found[current] = None
        elif line.startswith("branch refs/heads/") and current is not None:
            found[current] = line[len("branch refs/heads/"):]
    return found


def gc_plan(repo: Path, runs: list[Path], live: set[Path]) -> list[GcItem]:
    """What `legion gc` would do with each team worktree under `runs`."""
    target = default_branch(repo)
    known = _worktree_branches(repo)
    items: list[GcItem] = []
    for run_dir in runs:
        for path in sorted(p for p in (run_dir / WORKTREES).glob("*") if p.is_dir()):
            branch = known.get(path.resolve())
            if run_dir in live:
                items.append(GcItem(run_dir, path, branch, "keep", "its run is live"))
            elif branch is None:
                items.append(GcItem(run_dir, path, None, "keep", "not a registered git worktree with a branch"))
            elif target is None:
                items.append(GcItem(run_dir, path, branch, "keep", "no default branch to compare with"))
            elif _merged(repo, branch, target):
                items.append(GcItem(run_dir, path, branch, "remove", f"merged into {target}"))
            else:
                items.append(GcItem(run_dir, path, branch, "keep", f"not merged into {target}"))
    return items


def _merged(repo: Path, branch: str, target: str) -> bool:
    proc = subprocess.run(["git", "merge-base", "--is-ancestor", branch, target], cwd=str(repo),
                          capture_output=True, timeout=GIT_TIMEOUT_S, check=False, env=_git_env())
    return proc.returncode == 0


def gc_apply(repo: Path, items: list[GcItem], *, branches: bool) -> list[str]:
    """Remove what `gc_plan` marked; returns one line per action (failures say why)."""
    lines: list[str] = []
    for item in items:
        if item.action != "remove":
            continue
        try:
            git(repo, "worktree", "remove", "--force", str(item.path))
            _record_path(item.path).unlink(missing_ok=True)
            lines.append(f"removed {item.path}")
            if branches and item.branch:
                git(repo, "branch", "-D", item.branch)
                lines.append(f"deleted branch {item.branch}")
        except WorktreeError as exc:
            lines.append(f"could not remove {item.path}: {exc}")
    git(repo, "worktree", "prune", check=False)
    return lines
