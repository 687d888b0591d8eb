"""`legion completion bash|zsh`: the scripts shtab generates from the parser, loaded into a real bash and asked
to complete what a user types."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from legion.cli.app import build_parser, command_names
from tests.integration.cli_support import legion, project

RUN_IDS = ("20261201-010101-ffffff", "20261202-140312-a1b2c3")


def _complete(script: Path, cwd: Path, *words: str) -> list[str]:
    """What bash completes for `words` (the last one being typed), with the script sourced as a user would."""
    line = " ".join(words)
    program = (f"source {script}\n"
               f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
               f"COMP_LINE={line!r}; COMP_POINT=${{#COMP_LINE}}; COMPREPLY=()\n"
               "_shtab_legion\n"
               'printf "%s\\n" "${COMPREPLY[@]}"\n')
    out = subprocess.run(["bash", "--norc", "--noprofile", "-c", program], cwd=cwd, capture_output=True, text=True,
                         timeout=30, check=True)
    return sorted(line for line in out.stdout.splitlines() if line)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_completes_commands_options_choices_run_ids_and_directories() -> None:
    with project() as cwd:
        done = legion(cwd, "completion", "bash")
        assert done.returncode == 0, done.stderr
        script = cwd / "legion.bash"
        script.write_text(done.stdout)
        for run_id in RUN_IDS:
            (cwd / ".legion" / "runs" / run_id).mkdir(parents=True)
        (cwd / "subproject").mkdir()
        assert _complete(script, cwd, "legion", "") == sorted(command_names(build_parser()))
        assert _complete(script, cwd, "legion", "st") == ["status", "steer", "stop"]
        assert _complete(script, cwd, "legion", "run", "--de") == ["--detach"]
        assert _complete(script, cwd, "legion", "doctor", "mo") == ["models"]
        assert _complete(script, cwd, "legion", "mail", "--kind", "q") == ["question"]
        assert _complete(script, cwd, "legion", "completion", "") == ["bash", "zsh"]
        assert _complete(script, cwd, "legion", "status", "2026") == list(RUN_IDS)
        assert _complete(script, cwd, "legion", "resume", "20261202") == [RUN_IDS[1]]
        assert _complete(script, cwd, "legion", "status", "-C", "subp") == ["subproject"]


def test_zsh_script_is_a_completion_function_for_every_command() -> None:
    with project() as cwd:
        done = legion(cwd, "completion", "zsh")
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("#compdef legion")
        for name in command_names(build_parser()):
            assert f"\n    {name}:" in done.stdout, name
        assert "_files -/" in done.stdout and "ls .legion/runs" in done.stdout  # -C and RUN
        if shutil.which("zsh"):
            (cwd / "_legion").write_text(done.stdout)
            check = subprocess.run(["zsh", "-n", str(cwd / "_legion")], capture_output=True, text=True, timeout=30)
            assert check.returncode == 0, check.stderr


def test_an_unknown_shell_is_a_usage_error() -> None:
    with project() as cwd:
        done = legion(cwd, "completion", "fish")
        assert done.returncode == 2 and "invalid choice: 'fish'" in done.stderr
