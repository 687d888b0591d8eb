"""`.ci/first-command` runs the README's first command as written: it reads it from the README (cannot drift)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_it_reads_the_first_line_of_the_readmes_first_bash_block() -> None:
    block = re.search(r"^```bash\n(.*?)^```", (ROOT / "README.md").read_text(), re.S | re.M)
    assert block is not None
    first = next(line for line in block.group(1).splitlines() if line.strip())
    out = subprocess.run([str(ROOT / ".ci" / "first-command"), "--print"], capture_output=True, text=True, check=True)
    assert out.stdout.rstrip("\n") == first
    assert "pip install ." in first and "-e" not in first.split()  # the non-editable install a new user types


def test_ci_runs_it() -> None:
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert ".ci/first-command" in lines
