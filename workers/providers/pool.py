"""One pooled HTTP client per provider and event loop, shared by that provider's SDK clients.

An SDK client is built per (API key, base URL) — sessions in one process may carry different keys in
their environments — and every one of them sends through the same kept-alive connection pool.

`asdk` builds them in a worker thread: the first build imports the SDK (`import anthropic` takes ~1 s, more
under load) and makes an SSL context, which on the event loop would stall every session of the pool worker
and its application heartbeat. A worker forked after the fork server's late preload has the SDK already.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from typing import Any, Final

import orjson


class ClientPool:
    """``http_factory()`` makes the pooled HTTP client; ``sdk_factory(http, key, base_url)`` an SDK client."""

    def __init__(self, http_factory: Callable[[], Any], sdk_factory: Callable[[Any, str, str], Any]) -> None:
        self._http_factory = http_factory
        self._sdk_factory = sdk_factory
        self._http: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sdks: dict[tuple[str, str], Any] = {}
        self._building: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    def http(self) -> Any:
        """The pooled client for the running loop (a client is bound to the loop that made it)."""
        loop = asyncio.get_running_loop()
        if self._http is None or self._http.is_closed or self._loop is not loop:
            self._http = self._http_factory()
            self._loop = loop
            self._sdks.clear()
        return self._http

    async def asdk(self, key: str, base_url: str) -> Any:
        """`sdk` for async callers: what is not built yet is built in a thread, never on the loop."""
        loop = asyncio.get_running_loop()
        if self._current(loop) and (key, base_url) in self._sdks:
            return self._sdks[(key, base_url)]
        if self._building is None or self._building[0] is not loop:
            self._building = (loop, asyncio.Lock())
        async with self._building[1]:  # one build at a time: concurrent first calls share the result
            if not self._current(loop):
                http = await asyncio.to_thread(self._http_factory)
                self._http, self._loop = http, loop
                self._sdks.clear()
            client = self._sdks.get((key, base_url))
            if client is None:
                client = await asyncio.to_thread(self._sdk_factory, self._http, key, base_url)
                self._remember(key, base_url, client)
            return client

    def _current(self, loop: asyncio.AbstractEventLoop) -> bool:
        return self._http is not None and not self._http.is_closed and self._loop is loop

    def _remember(self, key: str, base_url: str, client: Any) -> None:
        if len(self._sdks) >= 64:
            self._sdks.pop(next(iter(self._sdks)))
        self._sdks[(key, base_url)] = client

    def sdk(self, key: str, base_url: str) -> Any:
        http = self.http()
        client = self._sdks.get((key, base_url))
        if client is None:
            client = self._sdk_factory(http, key, base_url)
            self._remember(key, base_url, client)
        return client

    async def aclose(self) -> None:
        http, self._http, self._loop = self._http, None, None
        self._sdks.clear()
        if http is not None and not http.is_closed:
            await http.aclose()


# The SDKs' documented way to make a raw request: ``client.post(path, cast_to=<their HTTP client's
# Response>, content=…)``. It keeps the SDK's auth and typed errors (the clients are built with max_retries=0:
# legion retries, in ``retry.py``, so that each retry is seen; the bytes replay on a retry) but skips building typed request/stream objects, which cost more than the
# stream itself (the ``stream`` raw-response header makes the SDK return before reading the body). The
# body goes as orjson bytes and the URL absolute: the SDK's own JSON encoder and its base-URL merge (a
# URL parse and copy) are the largest parts of its fixed cost per request (bench/providers.py).
RAW_STREAM_HEADERS: Final = {"X-Stainless-Raw-Response": "stream"}


def dumps(body: Any) -> bytes:
    """``body`` as JSON bytes (orjson; the standard library for what orjson refuses, e.g. huge ints)."""
    try:
        return orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:
        return json.dumps(body, separators=(",", ":")).encode()  # ASCII: a lone surrogate goes escaped


async def raw_stream(sdk: Any, url: str, body: dict[str, Any], headers: Mapping[str, Any]) -> Any:
    """POST ``body`` to ``url`` (absolute) through the SDK client; the open, unread streaming response
    (close it after use)."""
    import httpx2

    return await sdk.post(url, cast_to=httpx2.Response, content=dumps(body),
                          options={"headers": {**RAW_STREAM_HEADERS, **headers}})
