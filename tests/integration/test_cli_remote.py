"""Runs on servers, as a user runs them: `legion run --detach` and its status when the daemon dies, and the
monitor over tcp:// with CurveZMQ from a second process (refused without an allowed key, the full stream with one)."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import orjson
import pytest
import zmq.auth

from tests.events_schema import check_events
from tests.integration.cli_support import gate_worker, legion, legion_here, project, start, stop_process
from tests.support import wait_until


def _free_port_pair() -> int:
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        return int(port)
    raise AssertionError("no two adjacent free ports")


def _refused_at_once(endpoint: str, key: Path, server_key: Path, why: str) -> None:
    """A client the run refuses is told so within 1 s (not after the 2 s + 5 s of waiting for a snapshot)."""
    from legion.bus.monitor import MonitorRefused, MonitorStream
    from legion.bus.security import CurveClientConfig

    host, port = endpoint.rsplit(":", 1)
    started = time.monotonic()
    with pytest.raises(MonitorRefused, match=why):
        MonitorStream(endpoint, snapshot_endpoint=f"{host}:{int(port) + 1}",
                      curve=CurveClientConfig.from_certificates(key, server_key))
    assert time.monotonic() - started < 1.0


def _run_dir(cwd: Path, run_id: str) -> Path:
    return cwd / ".legion" / "runs" / run_id


def _run_json(run_dir: Path) -> dict[str, object]:
    try:
        data = orjson.loads((run_dir / "run.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def test_detach_prints_the_run_id_and_the_run_completes_in_the_background() -> None:
    with project(worker_sleep=0.5) as cwd:
        out = legion(cwd, "run", "--detach", "--model", "scripted/root.yaml", "task", timeout=30)
        assert out.returncode == 0, out.stderr
        run_id = out.stdout.strip()
        run_dir = _run_dir(cwd, run_id)
        pid = int((run_dir / "daemon.pid").read_text())
        assert os.getsid(pid) == pid  # its own session
        wait_until(lambda: _run_json(run_dir).get("status") == "settled",
                   message="the detached run to settle", deadline=30.0)

        def daemon_state() -> str:  # run.json says settled a moment before the daemon process exits
            state = str(orjson.loads(legion(cwd, "status", run_id, "--json").stdout)["state"])
            return state if "running" not in state else ""

        assert "exited (run status settled)" in wait_until(daemon_state, message="the detached daemon to exit", deadline=30.0)
        assert "settled (exit 0)" in (run_dir / "daemon.log").read_text()


def test_status_says_when_a_detached_daemon_died() -> None:
    with project() as cwd:
        run_id = legion(cwd, "run", "--detach", "--model", "scripted/root.yaml", "task").stdout.strip()
        run_dir = _run_dir(cwd, run_id)
        wait_until(lambda: "bash" in (run_dir / "w1.jsonl").read_text() if (run_dir / "w1.jsonl").exists() else False,
                   message="w1 at work", deadline=30.0)
        os.kill(int((run_dir / "daemon.pid").read_text()), signal.SIGKILL)
        state = wait_until(lambda: "DIED" in (s := legion(cwd, "status", run_id).stdout) and s, message="status", deadline=30.0)
        assert "legion resume" in state and "daemon.log" in state
        assert legion(cwd, "status", run_id).returncode == 1  # README "Commands": a dead root is not a 0
        dead = legion(cwd, "status", run_id, "--json")
        assert dead.returncode == 1 and orjson.loads(dead.stdout)["rootDied"] is True
        assert legion(cwd, "resume", run_id, "--all", "--timeout", "1").returncode in (0, 1)  # resumable


def test_tcp_monitor_with_curve_refuses_unknown_keys_and_streams_to_allowed_ones(capsys: pytest.CaptureFixture[str]) -> None:
    with project() as cwd:
        release = gate_worker(cwd)
        keys = cwd / "keys"
        for name in ("server", "alice", "mallory"):
            assert legion_here(cwd, capsys, "keys", name, "--dir", str(keys)).returncode == 0
        assert legion_here(cwd, capsys, "keys", "alice", "--dir", str(keys)).returncode == 2  # never overwrites
        (cwd / "allow.txt").write_text(f"# who may watch\n{keys / 'alice.key'}\n")
        port = _free_port_pair()
        endpoint = f"tcp://127.0.0.1:{port}"
        no_keys = legion(cwd, "run", "--monitor", endpoint, "--model", "scripted/root.yaml", "task")
        assert no_keys.returncode == 2 and "CurveZMQ" in no_keys.stderr
        run = start(cwd, "run", "--run-id", "m1", "--monitor", endpoint, "--monitor-key",
                    str(keys / "server.key_secret"), "--monitor-allow", str(cwd / "allow.txt"),
                    "--model", "scripted/root.yaml", "task")
        try:
            wait_until(lambda: "monitor" in _run_json(_run_dir(cwd, "m1")), message="the tcp monitor", deadline=30.0)
            mallory = legion(cwd, "monitor", endpoint, "--json", "--idle", "2", "--key",
                             str(keys / "mallory.key_secret"), "--server-key", str(keys / "server.key"))
            assert mallory.returncode == 1 and "allow-list" in mallory.stderr and not mallory.stdout
            assert "refused this client's key in the CurveZMQ handshake" in mallory.stderr
            assert "still live" not in mallory.stderr  # it is: it said no
            _refused_at_once(endpoint, keys / "mallory.key_secret", keys / "server.key", "not on the run's allow-list")
            _refused_at_once(endpoint, keys / "alice.key_secret", keys / "mallory.key", "not the run's public key")
            mallory_key = zmq.auth.load_certificate(keys / "mallory.key")[0].decode()
            relay_log = _run_dir(cwd, "m1") / "monitor-relay.log"
            wait_until(lambda: relay_log.exists() and f"refused client key {mallory_key}" in relay_log.read_text(),
                       message="the relay's log to name the refused key", deadline=10.0)
            alice = start(cwd, "monitor", endpoint, "--json", "--idle", "6", "--key", str(keys / "alice.key_secret"),
                          "--server-key", str(keys / "server.key"))
            assert alice.stdout is not None
            snapshot = alice.stdout.readline()  # she is subscribed: what happens from now on reaches her
            release.touch()  # w1 finishes only now, so its settling is in alice's stream, not in her snapshot
            assert run.wait(60) == 0
            out, _ = alice.communicate(timeout=30)
            assert alice.returncode == 0
        finally:
            stop_process(run)
        records = [orjson.loads(line) for line in (snapshot + out).splitlines()]
        check_events(records, "legion monitor tcp:// --json")
        assert records[0]["type"] == "snapshot" and records[0]["run"] == "m1"  # the run id from the snapshot
        seqs = [r["seq"] for r in records[1:]]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # no gap
        settled = [r["node"] for r in records[1:] if r["type"] == "node_settled"]
        assert "w1" in settled and "root" in settled


def test_a_tcp_monitor_port_in_use_refuses_the_run_with_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    with project(worker_sleep=0.5) as cwd:
        keys = cwd / "keys"
        for name in ("server", "alice"):
            assert legion_here(cwd, capsys, "keys", name, "--dir", str(keys)).returncode == 0
        (cwd / "allow.txt").write_text(f"{keys / 'alice.key'}\n")
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            out = legion(cwd, "run", "--run-id", "busy", "--monitor", f"tcp://127.0.0.1:{port}", "--monitor-key",
                         str(keys / "server.key_secret"), "--monitor-allow", str(cwd / "allow.txt"),
                         "--model", "scripted/root.yaml", "task")
        assert out.returncode == 2, out.stderr
        assert "Address already in use" in out.stderr and "Traceback" not in out.stderr
        assert _run_json(_run_dir(cwd, "busy"))["status"] == "refused"
