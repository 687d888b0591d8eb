"""Everything in a run directory is private: files 0600, folders 0700 (docs/spec-conformance.md §11, "Modes")."""

from __future__ import annotations

import os
import stat

from tests.integration.cli_support import legion, project


def test_a_finished_run_leaves_only_private_files_and_folders() -> None:
    with project(worker_sleep=0) as cwd:
        os.umask(0o022)  # the usual umask: what legion creates must not depend on the user's
        done = legion(cwd, "run", "--run-id", "m1", "--model", "scripted/root.yaml", "task")
        assert done.returncode == 0, done.stderr
        run_dir = cwd / ".legion" / "runs" / "m1"
        seen, loose = 0, []
        for folder, dirs, files in os.walk(run_dir):
            for name in [*dirs, *files]:
                path = os.path.join(folder, name)
                st = os.lstat(path)
                if stat.S_ISLNK(st.st_mode) or stat.S_ISSOCK(st.st_mode):
                    continue
                seen += 1
                want = 0o700 if stat.S_ISDIR(st.st_mode) else 0o600
                if stat.S_IMODE(st.st_mode) & ~want:
                    loose.append(f"{oct(stat.S_IMODE(st.st_mode))} {os.path.relpath(path, run_dir)}")
        assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
        assert seen > 5 and not loose, loose
        assert (run_dir / "legion.db").exists() and (run_dir / "artifacts").is_dir()
