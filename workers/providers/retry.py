"""Retries of a model request, done by legion so that each one can be seen (docs/events.md, "Retries").

The SDKs would retry a 429, a 5xx or a lost connection themselves, silently; legion builds their clients with
``max_retries=0`` and runs the same policy here, so that every retry is a ``retry_scheduled`` event (then
``retry_succeeded`` or ``retry_gave_up``): a line on stderr, an event in ``legion run --json`` and a line in the
run's ``legion.log``. The policy is the SDKs' own: ``x-should-retry`` decides when the server sends it, else
408, 409, 429 and 5xx are retried, and connection errors and timeouts; the wait is what ``retry-after-ms`` or
``retry-after`` says (at most ``MAX_RETRY_AFTER_S``), else 0.5 s doubled per retry up to 8 s, less up to 25 %
jitter.
"""

from __future__ import annotations

import email.utils
import random
import time
from dataclasses import dataclass
from typing import Any

from legion.bus.protocol import RETRY_GAVE_UP, RETRY_SCHEDULED, RETRY_SUCCEEDED
from legion.workers.providers.errors import body_message, class_names, excerpt

INITIAL_DELAY_S = 0.5
MAX_DELAY_S = 8.0
MAX_RETRY_AFTER_S = 60.0  # a server asking for a longer wait gets the backoff instead (the request fails sooner)
RETRY_STATUSES = frozenset({408, 409, 429})
CONNECTION_ERRORS = frozenset({"APIConnectionError", "APITimeoutError"})


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a request is worth retrying: the HTTP status (None for a connection error) and a short text."""

    status_code: int | None
    error: str


def retryable(exc: BaseException) -> Failure | None:
    """The failure of a request that may be sent again, or None when a retry cannot help (a 400, a 401 …)."""
    status = getattr(exc, "status_code", None)
    response = getattr(exc, "response", None)
    if isinstance(status, int) and response is not None:
        header = _header(response, "x-should-retry")
        if header == "false" or (header != "true" and status not in RETRY_STATUSES and status < 500):
            return None
        return Failure(status, excerpt(body_message(exc), 200) or f"HTTP {status}")
    if class_names(exc) & CONNECTION_ERRORS:
        cause = exc.__cause__
        why = f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)
        return Failure(None, excerpt(f"{type(exc).__name__} ({why})", 200))
    return None


def retry_delay(exc: BaseException, retry: int) -> float:
    """Seconds to wait before retry number `retry` (1 for the first)."""
    asked = _retry_after(getattr(exc, "response", None))
    if asked is not None and 0 < asked <= MAX_RETRY_AFTER_S:
        return asked
    return min(INITIAL_DELAY_S * 2.0 ** min(retry - 1, 1000), MAX_DELAY_S) * (1 - 0.25 * random.random())


def _header(response: Any, name: str) -> str | None:
    try:
        value = response.headers.get(name)
    except Exception:  # not an HTTP response after all
        return None
    return value if isinstance(value, str) else None


def _retry_after(response: Any) -> float | None:
    """`retry-after-ms`, else `retry-after` (seconds, or an HTTP date), in seconds; None when absent or bad."""
    if response is None:
        return None
    ms = _header(response, "retry-after-ms")
    try:
        if ms is not None:
            return float(ms) / 1000
    except ValueError:
        pass
    value = _header(response, "retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        date = email.utils.parsedate_tz(value)
        return None if date is None else float(email.utils.mktime_tz(date) - time.time())


def describe_retry(name: str, body: dict[str, Any]) -> str:
    """The plain line of a retry event (stderr and legion.log): what failed, which retry, how long the wait."""
    attempt, most = body.get("attempt"), body.get("max_retries")
    cause = _cause(body)
    where = f"{body.get('model') or body.get('provider') or 'model'} request"
    if name == RETRY_SCHEDULED:
        delay = float(body.get("delay_ms") or 0) / 1000
        return f"{where} failed ({cause}); retry {attempt} of {most} in {delay:.1f}s"
    if name == RETRY_SUCCEEDED:
        return f"{where} answered on retry {attempt} of {most}"
    if name == RETRY_GAVE_UP:
        return f"{where} still failing after {attempt} retries ({cause}); giving up"
    return f"{where}: {name}"


def _cause(body: dict[str, Any]) -> str:
    status, error = body.get("status_code"), str(body.get("error") or "")
    return f"HTTP {status}: {error}" if status is not None else error or "error"
