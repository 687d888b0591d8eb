"""A connection failure names its fix (workers/providers/errors.py `describe`): a host name that does not resolve is
the machine's network (or baseUrl), not a server that is down."""

from __future__ import annotations

import httpx

from legion.workers.providers.errors import Where, describe

WHERE = Where("anthropic", "https://api.anthropic.com/v1/messages", "ANTHROPIC_API_KEY", 60_000, 2)


def _failed(message: str) -> BaseException:
    try:
        try:
            raise OSError(-2, message)
        except OSError as cause:
            raise httpx.ConnectError(str(cause)) from cause
    except httpx.ConnectError as exc:
        return exc


def test_a_name_that_does_not_resolve_points_at_the_network() -> None:
    text = describe(_failed("Name or service not known"), WHERE, "claude-sonnet-4-5")
    assert "host name does not resolve" in text and "HTTPS_PROXY" in text and "server is running" not in text


def test_a_refused_connection_points_at_the_server() -> None:
    text = describe(_failed("Connection refused"), WHERE, "claude-sonnet-4-5")
    assert "check that the server is running and baseUrl is right" in text
