"""Wire safety: strings orjson refuses (lone UTF-16 surrogates from a model stream) never crash a bus
peer or a worker and are never lost — encode refuses them with ProtocolError, the control and monitor
send paths count and drop such a frame and keep working, and the session service repairs them (the
transcript writer's repair) before they go on the wire. Also: the service closes its pooled clients."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from legion.bus.control import ControlClient, ControlServer, control_endpoint
from legion.bus.monitor import MonitorPublisher
from legion.bus.protocol import Message, ProtocolError, decode, encode
from legion.workers.session_service import SessionService
from legion.workers.session_spec import SessionSpec
from legion.workers.transcript import read_transcript, valid_unicode
from tests.support import poller

pytestmark = pytest.mark.timeout(30)
LONE = "\ud83d"  # the high half of 😀, as a provider stream split across chunks leaves it
REPAIRED = "\ufffd"


until = poller(10.0, 0.01)


def test_valid_unicode_joins_pairs_and_replaces_lone_halves() -> None:
    assert valid_unicode({"a": ["x\ud83d\ude00y", LONE], LONE: 1}) == {"a": ["x😀y", REPAIRED], REPAIRED: 1}
    assert valid_unicode("plain") == "plain"


@pytest.mark.parametrize("body", [{"name": "text_delta", "delta": f"a{LONE}"}, {"name": "x", "n": 2**70},
                                  {"name": "x", 1: "non-str key"}])
def test_encode_refuses_unencodable_bodies_with_a_protocol_error(body: dict[Any, Any]) -> None:
    with pytest.raises(ProtocolError) as err:
        encode(Message("event", "w1", body))
    assert err.value.reason == "unencodable" and "repair it before sending" in str(err.value)


def sent_by(rec: list[Message], name: str) -> list[Message]:
    return [m for m in rec if m.type == "event" and m.body.get("name") == name]


async def test_control_send_paths_count_and_drop_an_unencodable_frame_and_keep_working(tmp_path: Path) -> None:
    got: list[Message] = []

    async def on_root(worker: str, msg: Message) -> dict[str, Any] | None:
        got.append(msg)
        return {"echo": msg.body.get("x")} if msg.corr else None

    worker_got: list[Message] = []

    async def on_worker(msg: Message) -> dict[str, Any] | None:
        worker_got.append(msg)
        return {"bad": LONE} if msg.body.get("op") == "bad_reply" else {"fine": True}

    srv = ControlServer(control_endpoint(tmp_path), on_message=on_root)
    await srv.start()
    cli = ControlClient(srv.endpoint, "w1", on_message=on_worker)
    try:
        await cli.connect()
        await cli.send("ready", {"pid": os.getpid()})
        await until(lambda: srv.last_seen("w1") is not None, message="w1 ready")
        with pytest.raises(ProtocolError, match="unencodable"):
            await cli.send("event", {"name": "text_delta", "delta": LONE})
        with pytest.raises(ProtocolError, match="unencodable"):
            await cli.request("request", {"op": "x", "arg": LONE}, timeout=5)
        assert cli.drops["unencodable"] == 2
        with pytest.raises(ProtocolError, match="unencodable"):
            await srv.send("w1", "event", {"name": "x", "v": LONE})
        assert srv.drops["unencodable"] == 1
        # a handler whose reply cannot be encoded: the requester gets an error reply, nobody dies
        with pytest.raises(Exception, match="unencodable"):
            await srv.request("w1", "request", {"op": "bad_reply"}, timeout=5)
        assert cli.drops["unencodable"] == 3
        # both ends still work
        await cli.send("event", {"name": "text_delta", "delta": "after"})
        assert (await cli.request("request", {"op": "echo", "x": 5}, timeout=5)).body == {"echo": 5}
        assert (await srv.request("w1", "request", {"op": "ok"}, timeout=5)).body == {"fine": True}
        await until(lambda: sent_by(got, "text_delta"), message="the later event")
        assert [m.body["delta"] for m in sent_by(got, "text_delta")] == ["after"]
    finally:
        await cli.close()
        await srv.close()


async def test_monitor_counts_and_drops_an_unencodable_event_and_keeps_publishing(tmp_path: Path) -> None:
    for batch in (True, False):
        pub = MonitorPublisher(tmp_path / f"m{int(batch)}", provider=lambda: {}, batch=batch)
        (tmp_path / f"m{int(batch)}").mkdir(mode=0o700)
        await pub.start()
        try:
            if batch:
                pub.publish("worker_event", {"text": LONE})
                pub.flush()
            else:
                with pytest.raises(ProtocolError, match="unencodable"):
                    pub.publish("worker_event", {"text": LONE})
            assert pub.drops["unencodable"] == 1
            assert pub.publish("worker_event", {"text": "fine"}) > 0
        finally:
            await pub.close()


def lone_script(tmp_path: Path) -> Path:
    """A model whose text and tool arguments carry a lone surrogate (JSON escapes json.loads keeps)."""
    path = tmp_path / "lone.json"
    path.write_text('{"turns": [{"text": "smile \\ud83d now", "chunks": 3, "tool_calls": [{"name": "ls", '
                    '"arguments": {"path": "dir-\\ud83d"}}]}], "default": {"text": "bye \\ud83d"}}')
    return path


async def test_service_repairs_lone_surrogates_in_events_and_replies_through_real_encode(tmp_path: Path) -> None:
    frames: list[Message] = []

    async def send(type_: str, body: dict[str, Any]) -> None:
        frames.append(decode(encode(Message(type_, "w1", body))))  # what the real control client does

    service = SessionService(send=send, request=None)
    service.start()
    try:
        spec = SessionSpec.from_dict({"nodeId": "n", "cwd": str(tmp_path), "model": "scripted/s",
                                      "transcript": str(tmp_path / "n.jsonl"), "tools": ["ls"],
                                      "scripts": {"s": str(lone_script(tmp_path))}, "prompt": "go"})
        await service.launch(spec)
        r = await service.handle_request({"op": "session.wait", "nodeId": "n", "timeoutMs": 10000})
        assert r["ok"] and r["settled"]
        await until(lambda: sent_by(frames, "agent_settled"), message="agent_settled forwarded")
        deltas = "".join(m.body["delta"] for m in sent_by(frames, "text_delta"))
        assert deltas == f"smile {REPAIRED} nowbye {REPAIRED}"  # every delta arrived, repaired
        starts = [m.body for m in sent_by(frames, "tool_call") if m.body["phase"] == "start"]
        assert starts[0]["args"] == {"path": f"dir-{REPAIRED}"}
        assert service.dropped_events == 0 and service.repaired_frames >= 2
        # a reply carrying model text is repaired too (the bus would refuse it otherwise)
        orjson.dumps(await service.handle_request({"op": "session.stats"}))
        texts = [b.get("text") for e in read_transcript(tmp_path / "n.jsonl").entries
                 if e.get("type") == "message" for b in e["message"].get("content", []) if isinstance(b, dict)]
        assert f"smile {REPAIRED} now" in texts  # the transcript keeps the repaired text
    finally:
        await service.close()


async def test_close_closes_the_pooled_provider_clients(tmp_path: Path) -> None:
    service = SessionService(send=None, request=None)
    closed: list[bool] = []
    real_aclose = service.registries.aclose

    async def spy() -> None:
        closed.append(True)
        await real_aclose()

    service.registries.aclose = spy
    spec = SessionSpec.from_dict({"nodeId": "n", "cwd": str(tmp_path), "model": "scripted/s",
                                  "transcript": str(tmp_path / "n.jsonl"),
                                  "scripts": {"s": {"default": {"text": "ok"}}}, "prompt": "go"})
    await service.launch(spec)
    await service.close()
    assert closed == [True]
