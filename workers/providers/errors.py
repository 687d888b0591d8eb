"""Provider failures as messages a person can act on: what failed, where, and the fix.

Works on the official SDKs' exceptions (``anthropic`` and ``openai`` share the shapes
``APIStatusError``/``APIConnectionError``/``APITimeoutError``) and on the HTTP client's own errors
raised while a stream is read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

CONTEXT_MARKERS = ("context_length_exceeded", "prompt is too long", "maximum context length", "context window",
                   "too many tokens", "input is too long", "model_context_window_exceeded")


@dataclass(frozen=True)
class Where:
    provider: str
    url: str
    key_env: str | None
    timeout_ms: int
    max_retries: int
    closest: Callable[[str], list[str]] | None = None  # model id -> the nearest known ids


def excerpt(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"


def looks_like_html(text: str) -> bool:
    head = text.lstrip()[:200].lower()
    return head.startswith(("<!doctype html", "<html")) or "<body" in head


def class_names(exc: BaseException) -> set[str]:
    # the SDKs' HTTP client (httpx2) is reached only through them; its exception classes are matched by
    # name so legion does not import it directly
    return {c.__name__ for c in type(exc).__mro__}


def body_message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        msg = err.get("message") if isinstance(err, dict) else err
        if msg:
            return str(msg)
    response = getattr(exc, "response", None)
    text = ""
    try:
        text = response.text if response is not None else ""
    except Exception:  # a streamed body that was not read
        text = ""
    if text and looks_like_html(text):
        return "the server returned an HTML page instead of JSON (a proxy, a login page or a wrong baseUrl?)"
    return text or str(body or getattr(exc, "message", "") or "")


# what the resolver says when a host name does not resolve (glibc, musl, macOS): the network, not the server
_NO_NAME = ("Name or service not known", "Temporary failure in name resolution", "nodename nor servname",
            "No address associated with hostname")


def describe(exc: BaseException, where: Where, model_id: str) -> str:
    """One line naming the provider, the cause and the fix."""
    p = f"provider {where.provider!r}"
    names = class_names(exc)
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return _describe_status(status, body_message(exc), where, model_id)
    if "APITimeoutError" in names or "TimeoutException" in names:
        return (f"{p}: timed out talking to {where.url} ({type(exc).__name__}; timeoutMs={where.timeout_ms}) "
                f"— raise providers.{where.provider}.timeoutMs or check the server")
    if "APIConnectionError" in names or "TransportError" in names or "HTTPError" in names:
        cause = exc.__cause__ or exc
        fix = ("the host name does not resolve: check this machine's network (DNS, or a proxy in HTTPS_PROXY) and "
               "baseUrl" if any(m in str(cause) for m in _NO_NAME) else "check that the server is running and baseUrl "
               "is right")
        return f"{p}: connection to {where.url} failed: {type(cause).__name__}: {cause or 'no detail'} — {fix}"
    return f"{p} failed: {type(exc).__name__}: {exc}"


def is_unknown_model(status: Any, message: str) -> bool:
    return status == 404 and "model" in message.lower()


def unknown_model_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the server saying it does not serve the requested model."""
    status = getattr(exc, "status_code", None)
    return isinstance(status, int) and is_unknown_model(status, body_message(exc))


def unusable_model_error(exc: BaseException) -> bool:
    """Whether ``exc`` says this model cannot be used at all from here (authentication refused, model unknown to the
    server), so another model may work; a bad request, a rate limit or a network failure is not."""
    status = getattr(exc, "status_code", None)
    return status in (401, 403) or unknown_model_error(exc)


def _describe_status(status: int, message: str, where: Where, model_id: str) -> str:
    p = f"provider {where.provider!r}"
    detail = f"HTTP {status} from {where.url}: {excerpt(message) or 'no detail'}"
    lowered = message.lower()
    if status in (401, 403):
        key = f"the key in {where.key_env}" if where.key_env else "the configured key"
        return f"{p}: authentication failed ({detail}) — check that {key} is valid for this endpoint"
    if any(m in lowered for m in CONTEXT_MARKERS):
        return (f"{p}: the conversation is longer than {model_id}'s context window ({detail}) — start a new "
                "session, cut large tool outputs, or use a model with a larger context window")
    if is_unknown_model(status, lowered):
        near = where.closest(model_id) if where.closest else []
        hint = f"closest known: {', '.join(near)}" if near else "check the model id"
        return f"{p}: unknown model {model_id!r} ({detail}) — {hint}"
    if status in (429, 529) or "overloaded" in lowered:
        what = "rate limited" if status == 429 else "overloaded"
        return (f"{p}: {what} and still failing after {where.max_retries} retries ({detail}) — wait and retry, "
                f"run fewer sessions at once, or raise providers.{where.provider}.maxRetries")
    return f"{p}: {detail}"


async def not_a_stream(resp: Any, provider: str, url: str) -> str | None:
    """An error message when a 200 response is not a server-sent event stream (HTML, plain JSON …)."""
    ctype = resp.headers.get("content-type", "")
    if not ctype or "text/event-stream" in ctype:
        return None
    text = (await resp.aread()).decode("utf-8", "replace")
    if looks_like_html(text):
        what = "an HTML page instead of an event stream (a proxy, a login page or a wrong baseUrl?)"
    else:
        what = f"{ctype} instead of an event stream: {excerpt(text) or 'empty body'}"
    return f"provider {provider!r}: {url} returned {what}"


_SSE_FIELDS = (b":", b"data:", b"event:", b"id:", b"retry:")


def no_events(head: bytes | bytearray, provider: str, url: str) -> str | None:
    """An error message when a body said to be an event stream held no event at all (an HTML page behind a
    missing or wrong Content-Type, a whole JSON answer …); None when it looks like a stream cut short."""
    text = head.decode("utf-8", "replace").strip()
    if not text or text.encode().startswith(_SSE_FIELDS):
        return None
    if looks_like_html(text):
        what = "an HTML page instead of an event stream (a proxy, a login page or a wrong baseUrl?)"
    else:
        what = f"no server-sent events but: {excerpt(text)} — check baseUrl and that the server streams"
    return f"provider {provider!r}: {url} returned {what}"
