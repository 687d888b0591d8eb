"""`legion run --run-id ID --or-resume`: one command line that a Kubernetes Job or a systemd service runs again after
a pause (docs/servers.md). The first time it starts the run; after a SIGTERM (a pod deleted, `systemctl stop`:
exit 130) the same line resumes that run; once the run finished it says so and exits 0."""

from __future__ import annotations

import signal

import orjson

from tests.integration.cli_support import gate_worker, legion, live_run, project, start, stop_process
from tests.support import wait_until

RUN = ("run", "--run-id", "job1", "--or-resume", "--model", "scripted/root.yaml", "task")


def test_the_same_command_starts_resumes_after_a_sigterm_then_reports_the_run_finished() -> None:
    with project() as cwd:
        release = gate_worker(cwd)
        proc = start(cwd, *RUN)
        try:
            run_dir = live_run(cwd, needle='"bash"')
            wait_until(lambda: orjson.loads((run_dir / "run.json").read_bytes()).get("status") == "running",
                       message="run.json to say the run is running", deadline=30.0)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 130
        finally:
            stop_process(proc)
        release.touch()  # w1's bash, run again on resume, finishes
        again = legion(cwd, *RUN, timeout=90)
        assert again.returncode == 0, again.stderr + again.stdout
        assert "run job1 exists (paused): resuming it" in again.stderr
        assert "all done" in again.stdout
        assert sorted(p.name for p in (cwd / ".legion" / "runs").iterdir()) == ["job1"]  # one run, continued
        third = legion(cwd, *RUN)
        assert third.returncode == 0, third.stderr
        assert "run job1 finished already (settled)" in third.stderr


def test_or_resume_without_a_run_id_is_a_usage_error() -> None:
    with project() as cwd:
        out = legion(cwd, "run", "--or-resume", "--model", "scripted/root.yaml", "task")
        assert out.returncode == 2 and "--or-resume needs --run-id" in out.stderr
        assert not (cwd / ".legion" / "runs").exists()
