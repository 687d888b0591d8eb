"""Which failed model requests legion sends again and how long it waits (workers/providers/retry.py, docs/events.md
"Retries"): the SDKs' policy, run by legion so that each retry is an event."""

from __future__ import annotations

import email.utils
import time
from typing import Any

import pytest

from legion.workers.providers.retry import MAX_DELAY_S, describe_retry, retry_delay, retryable


class _Response:
    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers


class _Status(Exception):
    """The shape of the SDKs' APIStatusError: status_code, response, body."""

    def __init__(self, status: int, headers: dict[str, str] | None = None, message: str = "slow down") -> None:
        super().__init__(message)
        self.status_code, self.response = status, _Response(headers or {})
        self.body: Any = {"error": {"message": message}}


class APIConnectionError(Exception):
    """Named as the SDKs' class (they are matched by name)."""


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 529])
def test_rate_limits_server_errors_and_timeouts_are_retried(status: int) -> None:
    failure = retryable(_Status(status))
    assert failure is not None and failure.status_code == status and failure.error == "slow down"


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_a_request_the_server_refuses_is_not(status: int) -> None:
    assert retryable(_Status(status)) is None


def test_the_servers_x_should_retry_decides() -> None:
    assert retryable(_Status(429, {"x-should-retry": "false"})) is None
    assert retryable(_Status(400, {"x-should-retry": "true"})) is not None


def test_a_lost_connection_is_retried_and_says_why() -> None:
    try:
        try:
            raise OSError("Connection refused")
        except OSError as cause:
            raise APIConnectionError("Connection error.") from cause
    except APIConnectionError as exc:
        failure = retryable(exc)
    assert failure is not None and failure.status_code is None and "Connection refused" in failure.error
    assert retryable(ValueError("a bug")) is None


def test_the_wait_is_what_the_server_asks_else_a_jittered_doubling() -> None:
    assert retry_delay(_Status(429, {"retry-after-ms": "250"}), 1) == 0.25
    assert retry_delay(_Status(429, {"retry-after": "2"}), 1) == 2.0
    date = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 < retry_delay(_Status(429, {"retry-after": date}), 1) <= 31
    for retry, base in ((1, 0.5), (2, 1.0), (3, 2.0), (10, MAX_DELAY_S)):
        assert 0.75 * base <= retry_delay(_Status(500), retry) <= base
    assert retry_delay(_Status(429, {"retry-after": "3600"}), 1) <= 0.5  # too long a wait: the backoff instead


def test_the_plain_lines() -> None:
    body = {"attempt": 1, "max_retries": 2, "delay_ms": 400, "status_code": 429, "error": "slow down",
            "model": "anthropic/claude-sonnet-4-5"}
    assert describe_retry("retry_scheduled", body) == (
        "anthropic/claude-sonnet-4-5 request failed (HTTP 429: slow down); retry 1 of 2 in 0.4s")
    assert describe_retry("retry_succeeded", body) == "anthropic/claude-sonnet-4-5 request answered on retry 1 of 2"
    gave_up = {**body, "attempt": 2, "status_code": None, "error": "APIConnectionError (refused)"}
    assert describe_retry("retry_gave_up", gave_up) == (
        "anthropic/claude-sonnet-4-5 request still failing after 2 retries (APIConnectionError (refused)); giving up")
