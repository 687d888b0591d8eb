"""Wire protocol: round trips, the type registry, and every malformed-frame reason."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from legion.bus.protocol import (
    PROTOCOL_VERSION,
    REASONS,
    DropCounter,
    Message,
    ProtocolError,
    decode,
    encode,
    register_type,
    registered_types,
)

pytestmark = pytest.mark.timeout(60)


def frame(**over: object) -> bytes:
    obj: dict[str, object] = {"v": 1, "t": "heartbeat", "s": "w1", "c": None, "b": {}}
    obj.update(over)
    return orjson.dumps(obj)


def test_round_trip_keeps_every_field() -> None:
    msg = Message("event", "w1", {"name": "turn_start", "nodeId": "n1", "x": [1, 2]}, corr="c-9")
    assert decode(encode(msg)) == msg
    assert orjson.loads(encode(msg))["v"] == PROTOCOL_VERSION


def test_core_types_are_registered() -> None:
    assert {"ready", "heartbeat", "event", "request", "reply", "shutdown", "log", "error"} <= set(registered_types())


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"\xff\xfe not json", "not_json"),
        (b"", "not_json"),
        (b"[1, 2]", "not_object"),
        (b'"str"', "not_object"),
        (frame(v=2), "bad_version"),
        (frame(v="1"), "bad_version"),
        (frame(v=True), "bad_version"),
        (orjson.dumps({"t": "ready", "s": "w", "c": None, "b": {}}), "bad_version"),
        (frame(t=5), "bad_envelope"),
        (frame(s=None), "bad_envelope"),
        (frame(c=7), "bad_envelope"),
        (frame(b=[1]), "bad_envelope"),
        (frame(t="no_such_type"), "unknown_type"),
        (frame(t="event", b={}), "missing_field"),
        (frame(t="event", b={"name": 3}), "bad_field"),
        (frame(t="log", b={"level": "info", "msg": True}), "bad_field"),
    ],
)
def test_malformed_frames_raise_protocol_error_with_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError) as err:
        decode(raw)
    assert err.value.reason == reason
    assert reason in REASONS


def test_size_limit_is_checked_before_parsing() -> None:
    huge = b"{" * 5000  # would be not_json if parsed
    with pytest.raises(ProtocolError) as err:
        decode(huge, max_bytes=4096)
    assert err.value.reason == "oversized"
    ok = frame(t="event", b={"name": "x" * 100})
    assert decode(ok, max_bytes=len(ok)).body["name"] == "x" * 100


def test_encode_refuses_what_decode_would_refuse() -> None:
    with pytest.raises(ProtocolError, match="unknown_type"):
        encode(Message("nope", "w", {}))
    with pytest.raises(ProtocolError, match="missing_field"):
        encode(Message("event", "w", {}))
    with pytest.raises(ProtocolError, match="unencodable"):
        encode(Message("heartbeat", "w", {"x": object()}))
    with pytest.raises(ProtocolError, match="oversized"):
        encode(Message("heartbeat", "w", {"x": "y" * 100}), max_bytes=50)


def test_register_type_validates_and_refuses_conflicts() -> None:
    register_type("test.ping", {"n": int, "tag": (str, type(None))})
    register_type("test.ping", {"n": int, "tag": (str, type(None))})  # same spec: no-op
    assert decode(frame(t="test.ping", b={"n": 1, "tag": None})).body == {"n": 1, "tag": None}
    with pytest.raises(ProtocolError, match="bad_field"):
        decode(frame(t="test.ping", b={"n": True, "tag": "a"}))  # a bool is not a count
    with pytest.raises(ValueError, match="conflicting"):
        register_type("test.ping", {"n": str})
    with pytest.raises(ValueError, match="not a valid name"):
        register_type("Bad Name", {})
    with pytest.raises(ValueError, match="must map"):
        register_type("test.bad", {"n": "int"})  # type: ignore[dict-item]


def test_drop_counter_counts_by_reason() -> None:
    c = DropCounter()
    c.add("not_json")
    c.add("not_json")
    c.add("oversized", 3)
    assert c["not_json"] == 2 and c["oversized"] == 3 and c["other"] == 0
    assert c.total == 5
    assert c.snapshot() == {"not_json": 2, "oversized": 3}


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_raise_anything_but_protocol_error(raw: bytes) -> None:
    try:
        decode(raw)
    except ProtocolError as exc:
        assert exc.reason in REASONS


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["v", "t", "s", "c", "b", "x"]), json_values, max_size=6))
def test_arbitrary_json_objects_never_raise_anything_but_protocol_error(obj: dict[str, object]) -> None:
    try:
        msg = decode(orjson.dumps(obj))
    except ProtocolError as exc:
        assert exc.reason in REASONS
    else:
        assert decode(encode(msg)) == msg


def test_wire_safe_returns_encodable_values_as_they_are_and_repairs_lone_surrogates() -> None:
    from legion.bus.protocol import valid_unicode, wire_safe

    fine = {"a": ["x😀y"], "n": 1}
    assert wire_safe(fine) is fine
    broken = {"a": ["x\ud83d\ude00y", "lone\ud83d"], "lone\udc00": 1}
    repaired = wire_safe(broken)
    assert repaired == valid_unicode(broken) == {"a": ["x😀y", "lone\ufffd"], "lone\ufffd": 1}
    encode(Message("event", "w1", {"name": "x", **repaired}))  # now it goes on the wire
