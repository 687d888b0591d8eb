"""The reviewer's machine-readable verdict: the last fenced `legion-verdict` JSON block of an answer.

Format (the reviewer card teaches it)::

    ```legion-verdict
    {"ok": false,
     "summary": "one or two sentences",
     "issues": [{"severity": "blocker", "file": "pkg/mod.py", "line": 42, "message": "what and why"}]}
    ```

`ok` (boolean) and `summary` (string) are required; `issues` is a list of objects (or plain
strings) with `message` and optional `severity` (blocker|major|minor|nit; default major under
`"ok": false`, minor under `"ok": true`), `file`,
`line`. Unknown extra keys are ignored. `"ok": true` with a blocker or major issue is contradictory
and refused (the reviewer must decide), so a gate never opens on a verdict that lists a blocker. The phase machine's `verdict_ok`/`verdict_not_ok` use
`parse_verdict` (strict) or `find_verdict` (None when absent or malformed).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Final

from legion.agents.errors import VerdictError

VERDICT_FENCE: Final = "legion-verdict"
SEVERITIES: Final = ("blocker", "major", "minor", "nit")
GATING_SEVERITIES: Final = ("blocker", "major")  # any of these means the change cannot ship
MAX_SCAN_CHARS: Final = 256 * 1024
_BLOCK: Final = re.compile(
    r"^[ \t]*(`{3,}|~{3,})[ \t]*legion-verdict[ \t]*\n(.*?)^[ \t]*\1[ \t]*$", re.M | re.S
)


@dataclass(frozen=True)
class VerdictIssue:
    message: str
    severity: str = "major"
    file: str | None = None
    line: int | None = None


@dataclass(frozen=True)
class Verdict:
    ok: bool
    summary: str
    issues: tuple[VerdictIssue, ...] = ()

    @property
    def blockers(self) -> tuple[VerdictIssue, ...]:
        return tuple(i for i in self.issues if i.severity == "blocker")


def parse_verdict(text: str) -> Verdict:
    """The last `legion-verdict` block of `text`; `VerdictError` says what is missing or wrong."""
    if not isinstance(text, str):
        raise VerdictError(f"expected the reviewer's answer text (got {type(text).__name__})")
    # the verdict ends the answer: only its tail is searched, so a huge answer stays cheap
    blocks = _BLOCK.findall(text[-MAX_SCAN_CHARS:])
    if not blocks:
        raise VerdictError(f"no ```{VERDICT_FENCE} block found: the review must end with one")
    body = blocks[-1][1]
    try:
        raw = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise VerdictError(f"the {VERDICT_FENCE} block is not valid JSON: {exc}") from None
    return _verdict(raw)


def find_verdict(text: str) -> Verdict | None:
    """Like `parse_verdict`, but None when there is no well-formed verdict."""
    try:
        return parse_verdict(text)
    except VerdictError:
        return None


def format_verdict(verdict: Verdict) -> str:
    """Render a verdict as the fenced block a reviewer writes."""
    body = {
        "ok": verdict.ok,
        "summary": verdict.summary,
        "issues": [
            {
                k: v
                for k, v in (
                    ("severity", i.severity),
                    ("file", i.file),
                    ("line", i.line),
                    ("message", i.message),
                )
                if v is not None
            }
            for i in verdict.issues
        ],
    }
    return f"```{VERDICT_FENCE}\n{json.dumps(body, indent=2, ensure_ascii=False)}\n```"


def _verdict(raw: Any) -> Verdict:
    if not isinstance(raw, dict):
        raise VerdictError(f"the {VERDICT_FENCE} block must be a JSON object")
    ok = raw.get("ok")
    if not isinstance(ok, bool):
        raise VerdictError('"ok" must be true or false')
    summary = raw.get("summary")
    if not isinstance(summary, str) or not summary.strip():
        raise VerdictError('"summary" must be a non-empty string')
    issues = raw.get("issues", [])
    if not isinstance(issues, list):
        raise VerdictError('"issues" must be a list')
    # an issue without a severity follows the overall judgement: major under "ok": false, minor under true
    default = "minor" if ok else "major"
    parsed = tuple(_issue(i, n, default) for n, i in enumerate(issues))
    gating = [n for n, i in enumerate(parsed) if i.severity in GATING_SEVERITIES]
    if ok and gating:
        raise VerdictError(
            f'"ok" is true but issues[{gating[0]}] is a {parsed[gating[0]].severity}: a verdict with a '
            'blocker or major issue must say "ok": false (or downgrade the issue to minor/nit)'
        )
    return Verdict(ok=ok, summary=summary.strip(), issues=parsed)


def _issue(raw: Any, n: int, default: str) -> VerdictIssue:
    if isinstance(raw, str) and raw.strip():
        return VerdictIssue(message=raw.strip(), severity=default)
    if not isinstance(raw, dict):
        raise VerdictError(f"issues[{n}] must be an object with a message (or a string)")
    message = raw.get("message")
    if not isinstance(message, str) or not message.strip():
        raise VerdictError(f"issues[{n}].message must be a non-empty string")
    severity = raw.get("severity", default)
    if severity not in SEVERITIES:
        raise VerdictError(f"issues[{n}].severity must be one of {', '.join(SEVERITIES)}")
    file = raw.get("file")
    line = raw.get("line")
    if file is not None and not isinstance(file, str):
        raise VerdictError(f"issues[{n}].file must be a string")
    if line is not None and (isinstance(line, bool) or not isinstance(line, int) or line < 1):
        raise VerdictError(f"issues[{n}].line must be a positive integer")
    return VerdictIssue(message=message.strip(), severity=severity, file=file, line=line)
