"""Clone-pattern sequencing without sockets: stale drops, gaps, ticks, batches, malformed frames."""

from __future__ import annotations

import orjson
import pytest

from legion.bus.monitor import MonitorError, MonitorEvent, Snapshot, _CloneState
from legion.bus.protocol import PROCESS_EVENT_TYPES

pytestmark = pytest.mark.timeout(30)


def ev(seq: int, t: str = "text_delta") -> bytes:
    return orjson.dumps({"v": 1, "seq": seq, "t": t, "b": {"nodeId": "n"}})


def snapped(seq: int) -> _CloneState:
    c = _CloneState()
    req = orjson.loads(c.snapshot_request())
    snap = c.on_snapshot_reply(orjson.dumps({"v": 1, "snap": req["snap"], "seq": seq, "state": {"s": seq}}))
    assert snap == Snapshot(seq, {"s": seq})
    return c


def test_events_up_to_the_snapshot_are_dropped_then_contiguous_ones_delivered() -> None:
    c = snapped(5)
    for seq in (3, 4, 5):
        assert c.on_frame(ev(seq)) == ([], False)
    assert c.stale == 3
    out, resync = c.on_frame(ev(6))
    assert out == [MonitorEvent(6, "text_delta", {"nodeId": "n"})] and not resync
    assert c.last == 6 and c.gaps == 0


def test_a_hole_in_seq_asks_for_a_resnapshot() -> None:
    c = snapped(5)
    c.on_frame(ev(6))
    assert c.on_frame(ev(8)) == ([], True)
    assert c.gaps == 1 and c.last == 6


def test_a_tick_ahead_of_what_we_saw_reveals_lost_trailing_events() -> None:
    c = snapped(5)
    assert c.on_frame(orjson.dumps({"v": 1, "tick": 5})) == ([], False)
    assert c.on_frame(orjson.dumps({"v": 1, "tick": 7})) == ([], True)
    assert c.gaps == 1


def test_batches_deliver_in_order_and_stop_at_a_gap() -> None:
    c = snapped(10)
    frame = orjson.dumps({"v": 1, "batch": [[9, "a", {}], [10, "a", {}], [11, "a", {}], [12, "b", {"k": 1}], [14, "c", {}]]})
    out, resync = c.on_frame(frame)
    assert [e.seq for e in out] == [11, 12] and resync and c.last == 12


def test_malformed_frames_are_counted_not_fatal() -> None:
    c = snapped(0)
    for raw in (b"nope", b"[]", orjson.dumps({"v": 2, "seq": 1}), orjson.dumps({"v": 1, "batch": [[1, 2]]}),
                orjson.dumps({"v": 1, "seq": "1", "t": "x", "b": {}})):
        assert c.on_frame(raw) == ([], False)
    assert c.malformed == 5 and c.last == 0


def test_stale_or_bad_snapshot_replies() -> None:
    c = _CloneState()
    old = orjson.loads(c.snapshot_request())["snap"]
    new = orjson.loads(c.snapshot_request())["snap"]
    assert c.on_snapshot_reply(orjson.dumps({"v": 1, "snap": old, "seq": 1, "state": {}})) is None
    with pytest.raises(MonitorError, match="could not produce"):
        c.on_snapshot_reply(orjson.dumps({"v": 1, "snap": new, "error": "boom"}))
    with pytest.raises(MonitorError, match="integer seq"):
        c.on_snapshot_reply(orjson.dumps({"v": 1, "snap": new, "seq": "1", "state": {}}))
    with pytest.raises(MonitorError, match="not JSON"):
        c.on_snapshot_reply(b"\x00")


def test_process_event_names_are_pinned() -> None:
    # docs/spec-conformance.md §4.4: exactly these 11 process-domain events; changing the set is a contract revision.
    assert sorted(PROCESS_EVENT_TYPES) == sorted([
        "node_launched", "node_steered", "node_retired", "node_aborted", "ui_request", "text_delta",
        "tool_call", "turn_start", "agent_settled", "launch_queued", "launch_admitted",
    ])


def test_a_frame_from_another_publisher_epoch_asks_for_a_resnapshot() -> None:
    c = _CloneState()
    req = orjson.loads(c.snapshot_request())["snap"]
    c.on_snapshot_reply(orjson.dumps({"v": 1, "e": "old", "snap": req, "seq": 50, "state": {}}))
    same = orjson.dumps({"v": 1, "e": "old", "seq": 51, "t": "x", "b": {}})
    assert [e.seq for e in c.on_frame(same)[0]] == [51]
    assert c.on_frame(orjson.dumps({"v": 1, "e": "new", "seq": 1, "t": "x", "b": {}})) == ([], True)
    assert c.on_frame(orjson.dumps({"v": 1, "e": "new", "tick": 0})) == ([], True)
    assert c.restarts == 2 and c.gaps == 0
