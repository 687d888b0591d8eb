"""docs/protocol.md, proved: a client written from that document alone follows a live `legion run`.

The client below speaks raw pyzmq and orjson and imports nothing from legion (the run under test is
started as a user starts it, `legion run` with scripted models, through `cli_support`). It attaches
to the monitor (§3.3: subscribe, wait for a frame, snapshot), checks the snapshot against the ledger,
asks the operator socket (§4) for the tree's status, lets the run finish and receives every event to
the end with no gap; the state it keeps from the snapshot plus the events must end equal to the
ledger's. The same client follows a run's tcp monitor as a CurveZMQ client (§3.6), and a key that is not on
the run's allow-list receives nothing.
"""

from __future__ import annotations

import contextlib
import socket
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import zmq
import zmq.auth
import zmq.utils.monitor

from tests.integration.cli_support import gate_worker, live_run, project, start, stop_process

pytestmark = pytest.mark.timeout(180)

HEARTBEATS = ((zmq.HEARTBEAT_IVL, 1000), (zmq.HEARTBEAT_TIMEOUT, 3000), (zmq.HEARTBEAT_TTL, 3000))


Curve = tuple[bytes, bytes, bytes]  # (client public, client secret, server public), Z85


class Gap(AssertionError):
    """The stream lost events (docs/protocol.md §3.3 steps 4–6): this test expects none."""


class MonitorFollower:
    """§3.3 of docs/protocol.md: SUB on mon.sock, DEALER on snap.sock, snapshot then contiguous events."""

    def __init__(self, ctx: zmq.Context[Any], pub: str, snapshot: str, curve: Curve | None = None,
                 watch: bool = False) -> None:
        self.sub = ctx.socket(zmq.SUB)
        self.snap = ctx.socket(zmq.DEALER)
        # §3.6: a CURVE client that wants to know why it is refused watches its handshake events
        self.watch = self.snap.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH) if watch else None
        for sock in (self.sub, self.snap):
            sock.setsockopt(zmq.LINGER, 0)
            for opt, value in HEARTBEATS:
                sock.setsockopt(opt, value)
            if curve is not None:  # §3.6: a CURVE client on both sockets
                sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = curve
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(pub)
        self.snap.connect(snapshot)
        self.last = 0
        self.epoch = ""
        self.nodes: dict[str, dict[str, Any]] = {}
        self.events: list[tuple[int, str, dict[str, Any]]] = []
        self.ticks = 0

    def handshake_refusal(self, seconds: float) -> int | None:
        """The ZAP status code of a refused CURVE handshake seen within `seconds` (None: none seen)."""
        assert self.watch is not None
        if not self.watch.poll(int(seconds * 1000)):
            return None
        event = zmq.utils.monitor.parse_monitor_message(self.watch.recv_multipart())
        assert event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH, event
        return int(event["value"])

    def close(self) -> None:
        if self.watch is not None:  # drained, then stopped, then closed: libzmq blocks on a full monitor socket
            while self.watch.poll(0):
                self.watch.recv_multipart()
            self.snap.disable_monitor()
            self.watch.close(linger=0)
        self.sub.close(linger=0)
        self.snap.close(linger=0)

    def attach(self) -> dict[str, Any]:
        assert self.sub.poll(10_000), "no frame (event or tick) within 10 s"  # the subscription is live
        # a request of another version gets no reply (§3.2); the next, well-formed one is answered
        self.snap.send(orjson.dumps({"v": 2, "snap": "old"}))
        assert not self.snap.poll(500), "a snapshot request of another version was answered"
        self.snap.send(orjson.dumps({"v": 1, "snap": 1}))
        assert self.snap.poll(10_000), "no snapshot reply within 10 s"
        reply = orjson.loads(self.snap.recv())
        assert reply["v"] == 1 and reply["snap"] == 1 and "error" not in reply, reply
        assert isinstance(reply["seq"], int) and isinstance(reply["e"], str) and reply["e"], reply
        self.last, self.epoch = reply["seq"], reply["e"]
        self.nodes = {k: dict(v) for k, v in reply["state"]["nodes"].items()}
        return dict(reply["state"])

    def on_frame(self, raw: bytes) -> None:
        frame = orjson.loads(raw)
        assert isinstance(frame, dict) and frame.get("v") == 1, frame
        if frame.get("e") != self.epoch:
            raise Gap(f"a frame of epoch {frame.get('e')!r}, attached to {self.epoch!r}: the root restarted?")
        if "tick" in frame:
            self.ticks += 1
            if frame["tick"] > self.last:
                raise Gap(f"tick {frame['tick']} announces events after {self.last} that never arrived")
            return
        entries = frame["batch"] if "batch" in frame else [[frame["seq"], frame["t"], frame["b"]]]
        for seq, type_, body in entries:
            assert isinstance(seq, int) and isinstance(type_, str) and type_ and isinstance(body, dict), (seq, type_)
            if seq <= self.last:
                continue  # already in the snapshot
            if seq != self.last + 1:
                raise Gap(f"event {seq} after {self.last}")
            self.last = seq
            self.events.append((seq, type_, body))
            if isinstance(body.get("node_id"), str) and isinstance(body.get("status"), str):
                node = self.nodes.setdefault(body["node_id"], {})
                node["status"] = body["status"]
                if "parent_id" in body:
                    node["parent_id"] = body["parent_id"]

    def follow(self, finished: Callable[[], bool], quiet_ms: int = 2000) -> None:
        """Frames until the run has finished and nothing more arrived for `quiet_ms`."""
        while True:
            if self.sub.poll(quiet_ms if finished() else 500):
                self.on_frame(self.sub.recv())
            elif finished():
                return


def operator_request(ctx: zmq.Context[Any], run_dir: Path, identity: str, action: str,
                     args: dict[str, Any] | None = None, *, raw: bytes | None = None) -> dict[str, Any]:
    """One request on op.sock (§4.1), from a DEALER whose identity is the frame's sender."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IDENTITY, identity.encode())
    sock.connect(f"ipc://{run_dir}/op.sock")
    try:
        corr = f"{identity}-1"
        frame = {"v": 1, "t": "request", "s": identity, "c": corr,
                 "b": {"op": "legion.operator", "action": action, "args": args or {}}}
        sock.send(raw if raw is not None else orjson.dumps(frame))
        assert sock.poll(30_000), f"no answer to {action!r} on op.sock within 30 s"
        reply = orjson.loads(sock.recv())
        assert reply["v"] == 1 and reply["s"] == "operator", reply
        if raw is None:
            assert reply["c"] == corr, reply
        return dict(reply)
    finally:
        sock.close(linger=0)


def ledger(run_dir: Path) -> tuple[dict[str, str], list[tuple[int, str, str]]]:
    """(node id -> status, [(event id, node id, type)]) read straight from legion.db (§1)."""
    with contextlib.closing(sqlite3.connect(f"file:{run_dir / 'legion.db'}?mode=ro", uri=True, timeout=10)) as db:
        nodes = {str(i): str(s) for i, s in db.execute("SELECT id, status FROM nodes")}
        events = [(int(i), str(n), str(t)) for i, n, t in db.execute("SELECT id, node_id, type FROM events ORDER BY id")]
    return nodes, events


def test_a_client_written_from_the_protocol_doc_follows_a_live_run_with_no_gap() -> None:
    with project() as cwd, zmq.Context() as ctx, contextlib.ExitStack() as stack:
        release = gate_worker(cwd)  # w1 stays in its bash call until the client has attached
        run = start(cwd, "run", "--run-id", "proto", "--model", "scripted/root.yaml", "task")
        try:
            run_dir = live_run(cwd)  # op.sock is up and w1 is in its bash call
            ipc = _run_json(run_dir)["ipc"]  # §1: run.json names the sockets
            assert ipc == {"pub": f"ipc://{run_dir}/mon.sock", "snapshot": f"ipc://{run_dir}/snap.sock",
                           "operator": f"ipc://{run_dir}/op.sock", "control": f"ipc://{run_dir}/ctl.sock"}, ipc
            mon = MonitorFollower(ctx, ipc["pub"], ipc["snapshot"])
            stack.callback(mon.close)
            state = mon.attach()

            # the snapshot matches the ledger: every node the ledger knows, with the ledger's status
            statuses, events_before = ledger(run_dir)
            assert set(statuses) == {"root", "w1"}, statuses
            assert state["root"] == "root"
            for node, status in statuses.items():
                assert mon.nodes[node]["status"] == status == "running", (node, mon.nodes, statuses)
            assert mon.nodes["w1"]["parent_id"] == "root" and mon.nodes["w1"]["role"] == "worker"
            assert set(mon.nodes) - set(statuses) == {"pool"}  # infrastructure: in the snapshot, not the ledger
            assert mon.nodes["pool"]["infra"] is True
            # §3.2: model, phase and the figures per node, as the usage events so far have them
            for node, model in (("root", "scripted/root.yaml"), ("w1", "scripted/worker.yaml")):
                figures = mon.nodes[node]
                assert figures["model"] == model and figures["phase"] is None, figures
                assert figures["turns"] >= 1 and figures["tokens_in"] > 0 and figures["tokens_out"] >= 0, figures
                assert figures["cost_usd"] == 0.0 and figures["unknown_cost_tokens"] == 0, figures  # scripted: free

            # an operator request, a refused action, and a frame that is not UTF-8 (§4.1)
            status = operator_request(ctx, run_dir, "proto-client-1", "status")
            assert status["t"] == "reply" and status["b"]["ok"] is True, status
            assert "w1" in status["b"]["text"] and "running" in status["b"]["text"], status
            refused = operator_request(ctx, run_dir, "proto-client-2", "no-such-action")
            assert refused["t"] == "reply" and refused["b"]["ok"] is False, refused
            assert refused["b"]["code"] == "INVALID_PARAMS", refused
            bad = b'{"v":1,"t":"request","s":"proto-client-3","c":"x","b":{"op":"\xff"}}'
            error = operator_request(ctx, run_dir, "proto-client-3", "", raw=bad)
            assert error["t"] == "error" and error["c"] == "x" and error["b"]["reason"] == "bad_frame", error

            release.touch()  # w1 finishes now: its settling, and the root's, reach the client as events
            mon.follow(lambda: run.poll() is not None)
            assert run.returncode == 0, run.stderr.read() if run.stderr else ""
        finally:
            stop_process(run)
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.communicate(timeout=5)

        seqs = [seq for seq, _, _ in mon.events]
        assert seqs and seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs  # contiguous, from the snapshot on
        assert mon.ticks > 0
        types = [(body.get("node_id") or body.get("supervisor"), type_) for _, type_, body in mon.events]
        assert ("root", "supervisor_exited") in types, types

        # the snapshot plus the events end where the ledger ends, and every lifecycle fact the ledger
        # recorded after the snapshot came as an event
        final, events_after = ledger(run_dir)
        assert final == {"root": "settled", "w1": "settled"}, final
        assert {n: mon.nodes[n]["status"] for n in final} == final, mon.nodes
        new = [(node, type_) for _, node, type_ in events_after[len(events_before):]]
        assert ("w1", "node_settled") in new and ("root", "node_settled") in new, new
        for fact in new:
            assert fact in types, (fact, types)


def _free_port_pair() -> int:
    """A port P with P+1 free too (the snapshot endpoint is PORT+1)."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = int(a.getsockname()[1])
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        return port
    raise AssertionError("no two adjacent free ports")


def _run_json(run_dir: Path) -> dict[str, Any]:
    try:
        data = orjson.loads((run_dir / "run.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def test_the_same_client_over_tcp_with_curve_keys_and_a_refused_key() -> None:
    """§3.6: the tcp monitor speaks §3.1–§3.3 behind CurveZMQ; a key off the allow-list gets nothing."""
    with project() as cwd, zmq.Context() as ctx, contextlib.ExitStack() as stack:
        release = gate_worker(cwd)
        keys = cwd / "keys"
        keys.mkdir(mode=0o700)
        for name in ("server", "alice", "mallory"):
            zmq.auth.create_certificates(keys, name)
        (cwd / "allow.txt").write_text("# who may watch\nkeys/alice.key\n")  # relative to the list's folder
        port = _free_port_pair()
        run = start(cwd, "run", "--run-id", "tcp", "--monitor", f"tcp://127.0.0.1:{port}", "--monitor-key",
                    str(keys / "server.key_secret"), "--monitor-allow", str(cwd / "allow.txt"),
                    "--model", "scripted/root.yaml", "task")
        try:
            run_dir = live_run(cwd)
            monitor = _run_json(run_dir).get("monitor")  # written before op.sock is served (§1)
            assert isinstance(monitor, dict), _run_json(run_dir)
            assert (monitor["pub"], monitor["snapshot"]) == (f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}")
            server = monitor["serverKey"].encode()
            assert server == zmq.auth.load_certificate(keys / "server.key")[0]

            def curve(name: str) -> Curve:
                public, secret = zmq.auth.load_certificate(keys / f"{name}.key_secret")
                assert secret is not None
                return public, secret, server

            mallory = MonitorFollower(ctx, monitor["pub"], monitor["snapshot"], curve("mallory"), watch=True)
            stack.callback(mallory.close)
            # §3.6: the refusal is told within a second, as a handshake event with the ZAP status
            assert mallory.handshake_refusal(1.0) == 400
            assert not mallory.sub.poll(2000), "a key off the allow-list received a frame"
            # a refused handshake leaves the DEALER without a peer, and a send with no peer blocks (protocol.md §2):
            # the request either finds no one to take it (Again) or goes unanswered
            with contextlib.suppress(zmq.Again):
                mallory.snap.send(orjson.dumps({"v": 1, "snap": 1}), zmq.NOBLOCK)
            assert not mallory.snap.poll(2000), "a key off the allow-list got a snapshot"

            alice = MonitorFollower(ctx, monitor["pub"], monitor["snapshot"], curve("alice"))
            stack.callback(alice.close)
            alice.attach()
            statuses, events_before = ledger(run_dir)
            assert {n: alice.nodes[n]["status"] for n in statuses} == statuses == {"root": "running", "w1": "running"}

            release.touch()
            alice.follow(lambda: run.poll() is not None)
            assert run.returncode == 0
        finally:
            stop_process(run)
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.communicate(timeout=5)

        seqs = [seq for seq, _, _ in alice.events]
        assert seqs and seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
        final, events_after = ledger(run_dir)
        assert {n: alice.nodes[n]["status"] for n in final} == final == {"root": "settled", "w1": "settled"}
        types = [(body.get("node_id"), type_) for _, type_, body in alice.events]
        for fact in [(node, type_) for _, node, type_ in events_after[len(events_before):]]:
            assert fact in types, (fact, types)
