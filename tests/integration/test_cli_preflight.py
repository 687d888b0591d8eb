"""`legion run` needs no flags beyond the task, and refuses bad arguments before anything starts (README
"Choosing a model", "Before a run starts"): the real CLI in a throwaway project."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cli_support import LEGION, env, project
from tests.support import wait_until

KEYS = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")


@pytest.fixture
def proj() -> Iterator[Path]:
    with project() as path:
        yield path


def _env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in env().items() if k not in KEYS}
    out["PI_CODING_AGENT_DIR"] = "/nonexistent-pi-agent-dir"  # no pi models.json of the machine's user
    return {**out, **extra}


def _run(cwd: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LEGION, "-C", str(cwd), "run", *args], capture_output=True, text=True, timeout=120,
                          env=_env(**extra), stdin=subprocess.DEVNULL)  # fmt: skip


def _nothing_created(cwd: Path) -> None:
    assert not (cwd / ".legion" / "runs").exists(), sorted(p.name for p in (cwd / ".legion" / "runs").iterdir())


def test_no_model_and_no_key_is_refused_before_anything_starts(proj: Path) -> None:
    out = _run(proj, "fix the flaky test")
    assert out.returncode == 2, out.stderr
    for needle in ("--model PROVIDER/ID", "defaultModel", "legion doctor models"):
        assert needle in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    _nothing_created(proj)
    status = subprocess.run([*LEGION, "-C", str(proj), "status"], capture_output=True, text=True, env=_env())
    assert "no run" in (status.stdout + status.stderr).lower(), status.stdout + status.stderr  # no "newest run"


def _first_line_of_a_run(cwd: Path, **extra: str) -> tuple[str, dict[str, object]]:
    """Start a run, read its first stderr line, pause it (SIGINT) and return that line and run.json."""
    proc = subprocess.Popen([*LEGION, "-C", str(cwd), "run", "say hi", "--run-id", "r1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(**extra), stdin=subprocess.DEVNULL)
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline().strip()
        run_json = cwd / ".legion" / "runs" / "r1" / "run.json"
        wait_until(lambda: run_json.exists() and '"running"' in run_json.read_text(), 60, "the run to be running")
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    data = json.loads((cwd / ".legion" / "runs" / "r1" / "run.json").read_text())
    return first, data


# no network: the base URL points at a closed port, so a call fails at once if it is ever made
NOWHERE = {"ANTHROPIC_BASE_URL": "http://127.0.0.1:9", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}


@pytest.mark.parametrize(("keys", "model"), [
    ({"ANTHROPIC_API_KEY": "sk-test"}, "anthropic/claude-sonnet-4-5"),
    ({"OPENAI_API_KEY": "sk-test"}, "openai/gpt-4.1"),
    ({"ANTHROPIC_API_KEY": "sk-test", "OPENAI_API_KEY": "sk-test"}, "anthropic/claude-sonnet-4-5"),
])  # fmt: skip
def test_a_provider_key_alone_picks_its_documented_default_and_says_so(proj: Path, keys: dict[str, str],
                                                                      model: str) -> None:
    first, data = _first_line_of_a_run(proj, **keys, **NOWHERE)
    key = next(iter(keys))
    assert first.startswith("legion run · model " + model), first
    assert f"{key} is set" in first, first
    assert data["options"]["model"] == model  # type: ignore[index]  # resume continues with the same model


def test_default_model_in_settings_comes_before_a_key(proj: Path) -> None:
    (proj / ".legion").mkdir()
    (proj / ".legion" / "settings.json").write_text(json.dumps({"defaultModel": "scripted/echo"}))
    out = _run(proj, "say hi", ANTHROPIC_API_KEY="sk-test", **NOWHERE)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stderr.splitlines()[0] == "legion run · model scripted/echo (from defaultModel)", out.stderr


def test_model_flag_comes_first_and_is_named(proj: Path) -> None:
    out = _run(proj, "say hi", "--model", "scripted/echo", ANTHROPIC_API_KEY="sk-test", **NOWHERE)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stderr.splitlines()[0] == "legion run · model scripted/echo (from --model)", out.stderr


@pytest.mark.parametrize(("args", "needle"), [
    (["--model", "gpt4"], "provider/model-id"),
    (["--model", "nosuch/model-x"], "unknown provider 'nosuch'"),
    (["--model", "openai/gpt-4.1"], "OPENAI_API_KEY is not set"),
    (["--model", "anthropic/claude-sonnet-4-5"], "ANTHROPIC_API_KEY is not set"),
    (["--run-id", "../escape"], "not a plain name"),
    (["--run-id", "a/b"], "not a plain name"),
    (["--run-id", "/tmp/abs"], "not a plain name"),
    (["--run-id", ".."], "not a plain name"),
    (["--max-cost", "nan"], "--max-cost must be a finite number"),
    (["--max-cost", "inf"], "--max-cost must be a finite number"),
    (["--max-cost", "-1"], "--max-cost must be a finite number"),
    (["--max-cost", "0"], "--max-cost must be a finite number"),
    (["--timeout", "nan"], "--timeout must be a finite number"),
    (["--timeout", "inf"], "--timeout must be a finite number"),
    (["--timeout", "-1"], "--timeout must be a finite number"),
    (["--timeout", "0"], "--timeout must be a finite number"),
])  # fmt: skip
def test_bad_arguments_are_refused_before_the_supervisor_starts(proj: Path, args: list[str], needle: str) -> None:
    if "--model" not in args:
        args = [*args, "--model", "scripted/echo"]
    out = _run(proj, "say hi", *args)
    assert out.returncode == 2, out.stderr[-2000:]
    assert needle in out.stderr and "Traceback" not in out.stderr, out.stderr
    _nothing_created(proj)
    assert not (proj.parent / "escape").exists()
