"""Monitor byte bounds (issue 13 item 5): oversized event bodies are truncated, and say so; the PUB's
high-water mark (counted in frames) is derived from a byte budget."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from legion.bus.monitor import MAX_EVENT_BYTES, MonitorPublisher, truncate_body

pytestmark = pytest.mark.timeout(60)

json_leaf = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=400)
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=80) | st.dictionaries(
    st.text(max_size=300), inner, max_size=80), max_leaves=60)


@settings(max_examples=40, deadline=None)
@given(body=st.dictionaries(st.text(max_size=50), json_value, max_size=30), limit=st.integers(64, 5_000))
def test_a_truncated_body_fits_its_limit_and_says_so(body: dict[str, Any], limit: int) -> None:
    size = len(orjson.dumps(body))
    cut = truncate_body(body, size, limit)
    assert len(orjson.dumps(cut)) <= limit
    assert cut["truncated"] == {"bytes": size, "limit": limit}


def test_short_fields_survive_and_long_strings_are_cut() -> None:
    body = {"node_id": "w1", "name": "blob", "data": {"i": 7, "text": "x" * 900_000}}
    cut = truncate_body(body, len(orjson.dumps(body)), MAX_EVENT_BYTES)
    assert cut["node_id"] == "w1" and cut["name"] == "blob" and cut["data"]["i"] == 7
    assert cut["data"]["text"].startswith("xxx") and cut["data"]["text"].endswith("…")
    assert len(orjson.dumps(cut)) <= MAX_EVENT_BYTES


async def test_publish_truncates_before_queueing_and_counts_it() -> None:
    pub = MonitorPublisher(endpoint="ipc:///nonexistent/a", snapshot_endpoint="ipc:///nonexistent/b",
                           provider=dict, max_event_bytes=1000)
    small = {"nodeId": "n", "text": "short"}
    pub.publish("worker_event", small)
    pub.publish("worker_event", {"nodeId": "n", "text": "y" * 50_000})
    (_, _, first), (_, _, second) = pub._pending
    assert orjson.loads(orjson.dumps(first)) == small  # untouched below the limit
    cut = orjson.loads(orjson.dumps(second))
    assert cut["nodeId"] == "n" and cut["truncated"]["limit"] == 1000 and len(orjson.dumps(cut)) <= 1000
    assert pub.truncated == 1 and pub.last_seq == 2


def test_the_high_water_mark_follows_the_byte_budget() -> None:
    eps = {"endpoint": "ipc:///x/a", "snapshot_endpoint": "ipc:///x/b", "provider": dict}
    batched = MonitorPublisher(**eps, queue_bytes=16 << 20, max_event_bytes=64 << 10, max_batch_bytes=128 << 10)
    assert batched.sndhwm == (16 << 20) // ((192 << 10) + 1024)
    single = MonitorPublisher(**eps, batch=False, queue_bytes=16 << 20, max_event_bytes=64 << 10)
    assert single.sndhwm == (16 << 20) // ((64 << 10) + 1024)
    assert MonitorPublisher(**eps, sndhwm=7).sndhwm == 7
