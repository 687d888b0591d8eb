"""A run freezes what is alive once it is composed out of the cyclic collector's reach (a full collection then walks
what the tree made, not every imported object) and gives it back when it ends: a process that runs another run, or
embeds legion, keeps no frozen leftovers and its own collector thresholds."""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import tempfile
from pathlib import Path
from unittest import mock

import pytest

from legion.orchestration import run as run_module
from legion.orchestration.run import RunOptions, execute, prepare_run

pytestmark = pytest.mark.timeout(60)


def test_a_run_freezes_its_composed_objects_and_thaws_them_when_it_ends() -> None:
    cwd = Path(tempfile.mkdtemp(prefix="lgc", dir="/tmp"))  # short: ipc socket paths
    before = gc.get_threshold()
    try:
        with mock.patch.object(run_module.gc, "freeze", wraps=gc.freeze) as freeze:
            opts = RunOptions(task="say hi", cwd=cwd, model="scripted/echo", env=dict(os.environ), timeout=30)
            result = asyncio.run(execute(prepare_run(opts), install_signals=False))
        assert result.exit_code == 0, result.detail
        assert freeze.call_count == 1
        assert gc.get_freeze_count() == 0 and gc.get_threshold() == before
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
        shutil.rmtree(cwd, ignore_errors=True)
