"""Issue 24 item 6: three simulated hosts record into one PostgreSQL server on a fourth; one host's root is
killed mid-run; the fleet view, the fleet budget and the resumed run are checked (tests/fleet_trial.py).
bench/fleet_hosts.py runs the same trial many times in a row."""

from __future__ import annotations

import pytest

from tests import netns
from tests.fleet_trial import run_trial

pytestmark = [pytest.mark.timeout(300)]

_WHY_NOT = netns.unavailable()


@pytest.mark.skipif(_WHY_NOT is not None, reason=f"no network namespaces here: {_WHY_NOT}")
def test_three_hosts_one_killed_and_resumed() -> None:
    run_trial()
