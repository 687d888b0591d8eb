"""Every `legion` command builds the whole parser: building it must not import the ledger (SQLAlchemy) or the
run machinery, or `status`/`summary`/`timing` miss their 300 ms (bench/reports.py). The ledger's closed sets
(`legion.ledger.constants`, imported through the package's lazy exports) are free to use."""

from __future__ import annotations

import subprocess
import sys


def test_building_the_parser_imports_neither_sqlalchemy_nor_the_supervision_tree() -> None:
    code = ("import sys, legion.cli; legion.cli.build_parser(); "
            "print(sorted(m for m in ('sqlalchemy', 'legion.supervision.root', 'legion.ledger.ledger', "
            "'legion.ledger.engine', 'zmq') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout
