"""`legion run "task"` with no model and no key: refused (exit 2) in under 0.5 s, with nothing created.

Times the real console script in a throwaway git project, best of `--repeat`, as wall time and as the
process's own CPU time (user + system, from wait4: what a loaded machine's scheduling does not inflate).
The gate is on the CPU time; the wall time is reported beside it. Prints one JSON object; exit status 0
only when every refusal exits 2 within the target and leaves no `.legion/` behind.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

TARGET_S = 0.5
LEGION = str(Path(sys.executable).with_name("legion"))


def one(cwd: Path, env: dict[str, str]) -> tuple[float, float, int]:
    """(wall s, cpu s, exit status) of one refused `legion run`."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([LEGION, "run", "fix the flaky test"], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, proc.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")}
    env["PI_CODING_AGENT_DIR"] = "/nonexistent-pi-agent-dir"
    base = Path(tempfile.mkdtemp(prefix="lbr", dir="/tmp"))
    try:
        subprocess.run(["git", "init", "-q", str(base)], check=True)
        runs = [one(base, env) for _ in range(args.repeat)]
        created = (base / ".legion").exists()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    wall = min(r[0] for r in runs)
    cpu = min(r[1] for r in runs)
    codes = sorted({r[2] for r in runs})
    ok = codes == [2] and not created and cpu < TARGET_S
    print(orjson.dumps({"bench": "refusal", "target_s": TARGET_S, "best_cpu_s": round(cpu, 3),
                        "best_wall_s": round(wall, 3), "exit_codes": codes, "created": created,
                        "ok": ok}).decode())  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
