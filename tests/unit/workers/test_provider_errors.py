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


class _Status(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status_code, self.body = status, {"error": {"message": message}}


def test_only_an_unusable_model_is_worth_a_fallback_model() -> None:
    """Authentication refused or a model the server does not serve: another model may work; a bad request, a rate
    limit or a broken connection would fail the same way (or is the request's own fault)."""
    from legion.workers.providers.errors import unusable_model_error

    assert unusable_model_error(_Status(401, "invalid x-api-key"))
    assert unusable_model_error(_Status(403, "forbidden"))
    assert unusable_model_error(_Status(404, "model: claude-nope not found"))
    assert not unusable_model_error(_Status(400, "messages: invalid"))
    assert not unusable_model_error(_Status(429, "rate limited"))
    assert not unusable_model_error(_Status(404, "no such route"))
    assert not unusable_model_error(_failed("Connection refused"))
