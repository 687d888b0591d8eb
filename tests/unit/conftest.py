"""The unit folder's rule, enforced: a unit test starts no fork server (so no worker, pool or process tree)
and makes no cgroup. A test that needs them belongs in tests/integration/."""

from __future__ import annotations

from typing import Any, NoReturn

import pytest

from legion.procs import Cgroup
from legion.supervision.spawn import WorkerSpawner


@pytest.fixture(autouse=True)
def _no_process_trees(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(what: str) -> Any:
        def refused(*_args: Any, **_kwargs: Any) -> NoReturn:
            raise AssertionError(f"a unit test {what}: move it to tests/integration/ (see README, Layout)")

        return refused

    monkeypatch.setattr(WorkerSpawner, "start", refuse("starts a fork server"))
    monkeypatch.setattr(Cgroup, "child", refuse("makes a cgroup"))
    monkeypatch.setattr(Cgroup, "join", refuse("puts a process in a cgroup"))
