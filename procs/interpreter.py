"""The command line that starts one of legion's own Python processes, and how to read why one failed.

Every interpreter legion starts (the fork server, a detached `legion run`, the doctor's probes) runs
`python -P`: Python (3.11+) then does not put the current directory ('' for `-c`, the cwd for `-m`)
first on `sys.path`. legion runs inside the user's project, so without it a project's `legion/`
folder, `legion.py`, or a file named like a dependency or a standard-library module (`openai.py`,
`yaml.py`, `queue.py`) would be imported instead of the installed code — at start, or later, after a
worker has changed into the project. `-P` and not `-I`: `-I` would also drop `PYTHONPATH`, the
`PYTHON*` variables and the user site-packages, which breaks a `pip install --user` legion and the
user's deliberate `PYTHONPATH`; `-P` removes exactly the unsafe entry. It is a flag, not the
`PYTHONSAFEPATH` variable, so the user's own Python tools run by a session (which inherit the
environment) keep their usual `sys.path`. The working directory itself is not changed: tools and
sessions run in the project (README "Running a task").
"""

from __future__ import annotations

import sys


def python_command(*args: str) -> list[str]:
    """`[sys.executable, "-P", *args]`: an interpreter that imports only installed code (see module doc)."""
    return [sys.executable, "-P", *args]


# Runs first in a `python -P -c` process that imports `module` and calls `module.main()`: an import that
# fails is reported as one JSON line on the fd after `--fd` (when given) before the traceback goes to
# stderr, naming the file that was imported in place of the installed one.
_BOOT = """\
import sys
try:
    from {module} import main
except BaseException as exc:
    import json, os, traceback
    origin = None
    name = getattr(exc, "name", None) or ""
    parent = name.rpartition(".")[0]
    if parent and parent in sys.modules:
        origin = getattr(sys.modules[parent], "__file__", None)
    if origin is None:
        frames = [f.filename for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<")]
        origin = frames[-1] if frames else None
    report = {{"ok": False, "error": "".join(traceback.format_exception_only(exc)).strip(),
               "origin": origin, "traceback": traceback.format_exc()[-4000:]}}
    if "--fd" in sys.argv:
        try:
            os.write(int(sys.argv[sys.argv.index("--fd") + 1]), json.dumps(report).encode())
        except (OSError, ValueError, IndexError):
            pass
    raise
main()
"""


def boot_command(module: str, *args: str) -> list[str]:
    """`python -P -c …` that runs `module.main()` and reports an import failure (see `import_failure`)."""
    return python_command("-c", _BOOT.format(module=module), *args)


def import_failure(report: object) -> str | None:
    """One line from a `boot_command` failure report: the error and the file imported in its place."""
    if not isinstance(report, dict) or report.get("ok") is not False or not report.get("error"):
        return None
    line = str(report["error"]).splitlines()[-1]
    origin = report.get("origin")
    if isinstance(origin, str) and origin:
        line += (f" (from {origin}; if that is not legion's installed code, a file of that name hides it:"
                 " rename it, or take its folder off PYTHONPATH)")
    return line
