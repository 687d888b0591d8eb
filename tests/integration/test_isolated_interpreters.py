"""legion's own interpreters never import the user's project: a non-editable install run inside a project whose
files are named like legion, its dependencies and standard-library modules (README "Running a task")."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cli_support import env

REPO = Path(__file__).resolve().parents[2]
# each of these raises on import: a process that imports one from the project fails loudly
SHADOWS = ("legion/__init__.py", "legion.py", "openai.py", "yaml.py", "queue.py", "orjson.py", "zmq.py")


@pytest.fixture(scope="session")
def installed_legion() -> Iterator[Path]:
    """A venv with legion installed as `pip install .` does (a wheel, not the editable finder); its
    dependencies come from the test venv's site-packages through a plain path line (no editable `.pth`
    processing), so nothing is downloaded. Returns the venv's `legion` console script."""
    base = Path(tempfile.mkdtemp(prefix="lvi", dir="/tmp"))
    t0 = time.monotonic()
    try:
        src = base / "src"
        shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
            ".venv", ".git", "build", "__pycache__", "*.egg-info", ".legion", "node", ".*_cache", ".hypothesis"))
        venv = base / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        purelib = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
        (purelib / "_legion_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                        "--no-deps", "--no-build-isolation", "--no-index", str(src)],
                       check=True, capture_output=True, timeout=300)  # fmt: skip
        legion = venv / "bin" / "legion"
        where = subprocess.run([str(venv / "bin" / "python"), "-P", "-c", "import legion; print(legion.__file__)"],
                               capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
        assert where.startswith(str(purelib)), where  # the wheel's copy, not the checkout's
        print(f"non-editable legion installed in {time.monotonic() - t0:.1f} s")
        yield legion
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def shadowed_project() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="lsh", dir="/tmp"))
    for name in SHADOWS:
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(f"raise RuntimeError('the project file {name} was imported by legion')\n")
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True)
    subprocess.run(["git", "-C", str(path), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "x"],
                   check=True)  # fmt: skip
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _env() -> dict[str, str]:
    out = env()
    out.pop("PYTHONPATH", None)
    return out


@pytest.mark.timeout(300)
def test_run_inside_a_project_that_shadows_legion_and_its_dependencies(installed_legion: Path,
                                                                        shadowed_project: Path) -> None:
    proc = subprocess.run([str(installed_legion), "run", "say hi", "--model", "scripted/echo"], cwd=shadowed_project,
                          capture_output=True, text=True, timeout=120, env=_env(), stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "was imported by legion" not in proc.stdout + proc.stderr
    log = "".join(p.read_text(errors="replace") for p in (shadowed_project / ".legion" / "runs").glob("*/*.log"))
    assert "was imported by legion" not in log
    # the user's project stays the working directory of tools and sessions
    runs = list((shadowed_project / ".legion" / "runs").iterdir())
    assert len(runs) == 1


@pytest.mark.timeout(300)
def test_demo_inside_a_project_that_shadows_legion_and_its_dependencies(installed_legion: Path,
                                                                         shadowed_project: Path) -> None:
    proc = subprocess.run([str(installed_legion), "demo"], cwd=shadowed_project, capture_output=True, text=True,
                          timeout=180, env=_env(), stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "delivered branch legion/" in proc.stdout
    assert "was imported by legion" not in proc.stdout + proc.stderr


def test_detached_run_inside_a_shadowing_project(installed_legion: Path, shadowed_project: Path) -> None:
    """`legion run --detach` re-runs legion as `python -m legion`: that interpreter is isolated too."""
    proc = subprocess.run([str(installed_legion), "run", "say hi", "--model", "scripted/echo", "--detach"],
                          cwd=shadowed_project, capture_output=True, text=True, timeout=60, env=_env(),
                          stdin=subprocess.DEVNULL)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_id = proc.stdout.strip().splitlines()[-1]
    run_dir = shadowed_project / ".legion" / "runs" / run_id
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        status = subprocess.run([str(installed_legion), "status", run_id, "--json"], cwd=shadowed_project,
                                capture_output=True, text=True, env=_env())  # fmt: skip
        if '"settled"' in status.stdout or '"failed"' in status.stdout:
            break
        time.sleep(0.2)
    daemon_log = (run_dir / "daemon.log").read_text(errors="replace")
    assert "was imported by legion" not in daemon_log, daemon_log[-3000:]
    assert '"settled"' in status.stdout, status.stdout[-2000:] + daemon_log[-2000:]


def test_doctor_names_the_file_that_hides_legion_from_the_fork_server(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A fork server that cannot start: the doctor shows the import error and the shadowing file, not
    `pip install -e .`. PYTHONPATH is the one way left for a shadow to reach legion's interpreters."""
    from legion.cli.doctor_sections import spawn_checks

    shadow = tmp_path / "shadow"
    (shadow / "orjson.py").parent.mkdir()
    (shadow / "orjson.py").write_text("raise ImportError('a stray orjson.py')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")]))
    checks = {c.name: c for c in spawn_checks(tmp_path)}
    fork = checks["fork server"]
    assert fork.status == "fail"
    assert "a stray orjson.py" in fork.detail and str(shadow / "orjson.py") in fork.detail, fork.detail
    assert "pip install -e" not in fork.fix and "PYTHONPATH" in fork.fix
    assert checks["session worker"].status == "fail"
    assert "pip install -e" not in checks["session worker"].fix
