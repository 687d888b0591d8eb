"""What the SDK-backed providers share: the request, the streamed-body loop, retries and usage.

Each provider sends through its vendor's official SDK (``openai`` or ``anthropic``): the SDK brings auth and
typed errors. Retries of 429/5xx/connection errors (``maxRetries``, with the SDKs' backoff and ``Retry-After``) are
legion's own (``retry.py``), so that each one is seen: a ``RetryEvent`` in the stream. The body is posted raw (``pool.raw_stream``) and its server-sent events are parsed here with orjson,
because the SDKs' typed event objects cost more than the stream itself (bench/providers.py). One pooled
HTTP client per provider and event loop (``pool.ClientPool``) serves every call of every session in the
process; ``aclose()`` closes it. Every failure becomes an ``ErrorEvent`` naming the provider, the cause
and the fix.

A provider subclass names its SDK and endpoint and supplies only what differs: the request body
(``_body``), the per-response state (``_state``), the events of one ``data:`` payload (``_data``) and how
the stream ended (``_end``).
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from legion.bus.protocol import RETRY_GAVE_UP, RETRY_SCHEDULED, RETRY_SUCCEEDED
from legion.workers.providers.base import CompletionRequest, ErrorEvent, ProviderEvent, RetryEvent, UsageEvent
from legion.workers.providers.config import ProviderSettings
from legion.workers.providers.errors import Where, describe, no_events, not_a_stream, unusable_model_error
from legion.workers.providers.pool import ClientPool, raw_stream
from legion.workers.providers.pricing import closest, cost_usd, known_models
from legion.workers.providers.retry import retry_delay, retryable
from legion.workers.providers.sse import data_batches, drain

NO_KEY = "no-key"  # the SDKs insist on a key; a provider without one sends no key header at all

Parsed = ProviderEvent | list[ProviderEvent] | None  # what ``_data`` makes of one payload


@dataclass
class StreamState:
    """What one streamed response has said so far (the part every provider tracks)."""

    model_id: str
    base_url: str
    done: bool = False  # the stream's end marker seen
    over: bool = False  # stop reading (done, or an error)
    error: str | None = None
    count: int = 0  # payloads parsed


@dataclass
class SdkProvider:
    """A provider that posts through an official SDK and parses the event stream itself."""

    settings: ProviderSettings
    api: str = ""
    _pool: ClientPool = field(init=False, repr=False, compare=False)

    SDK: ClassVar[str]  # the SDK's module
    CLIENT: ClassVar[str]  # its async client class
    CLIENT_OPTIONS: ClassVar[Mapping[str, Any]] = {}
    PATH: ClassVar[str]  # the endpoint below the base URL
    KEY_HEADERS: ClassVar[tuple[str, ...]]  # the headers the SDK fills from the key (left out without one)
    CATALOG: ClassVar[str | None] = None  # the price catalog that names this API's models (None: the provider's name)

    def __post_init__(self) -> None:
        self._pool = ClientPool(self._make_http, self._make_sdk)

    @property
    def name(self) -> str:
        return self.settings.name

    def _sdk(self) -> Any:
        return importlib.import_module(self.SDK)

    def _timeout(self) -> Any:
        return self._sdk().Timeout(self.settings.timeout_ms / 1000, connect=10.0)

    def _make_http(self) -> Any:
        return self._sdk().DefaultAsyncHttpxClient(timeout=self._timeout())

    def _make_sdk(self, http: Any, key: str, base_url: str) -> Any:
        client = getattr(self._sdk(), self.CLIENT)
        return client(api_key=key, base_url=base_url, http_client=http, timeout=self._timeout(),
                      max_retries=0, default_headers=dict(self.settings.headers),  # legion retries (retry.py)
                      **self.CLIENT_OPTIONS)

    def client(self) -> Any:
        """The provider's pooled HTTP client for the running loop."""
        return self._pool.http()

    async def aclose(self) -> None:
        """Close the pooled client (when the hosting process stops)."""
        await self._pool.aclose()

    def check_model(self, model_id: str) -> None:
        self.settings.check_model(model_id)

    def _where(self, url: str) -> Where:
        s = self.settings
        return Where(s.name, url, s.key_env, s.timeout_ms, s.max_retries,
                     lambda m: closest(m, sorted(s.models) or list(known_models(self.CATALOG or s.name))))

    def _usage(self, model_id: str, base_url: str, *, input: int, output: int, cache_read: int = 0,
               cache_write: int = 0) -> UsageEvent:
        """The call's token counts and their cost (the model's configured price, else the catalog's)."""
        cost = cost_usd(self.name, model_id, self.settings.model(model_id).get("cost"), input=input, output=output,
                        cache_read=cache_read, cache_write=cache_write, base_url=base_url)
        return UsageEvent(input=input, output=output, cache_read=cache_read, cache_write=cache_write, cost_usd=cost)

    async def stream(self, request: CompletionRequest) -> AsyncIterator[ProviderEvent]:
        model_id = request.model.model_id
        try:
            self.check_model(model_id)
        except Exception as exc:
            yield ErrorEvent(str(exc), unusable_model=True)
            return
        key, key_error = self.settings.key(request.env)
        if key_error:
            yield ErrorEvent(key_error, unusable_model=True)
            return
        base_url = self.settings.url(request.env)
        url = f"{base_url}{self.PATH}"
        try:
            body = self._body(request)  # first: a request that cannot be built fails without importing the SDK
            sdk = await self._pool.asdk(key or NO_KEY, base_url)  # imports the SDK off the loop the first time
            extra = {} if key else dict.fromkeys(self.KEY_HEADERS, self._sdk().Omit())
            sent: list[Any] = []
            async for retry in self._send(sdk, url, body, extra, sent):
                yield retry
            resp = sent[0]
            try:
                problem = await not_a_stream(resp, self.name, url)
                if problem:
                    yield ErrorEvent(problem)
                    return
                state = self._state(model_id, base_url)
                head = bytearray()
                batches = data_batches(resp, head)
                parse = self._data
                async for batch in batches:
                    for data in batch:
                        out = parse(data, state)
                        if out.__class__ is list:
                            for event in out:
                                yield event
                        elif out is not None:
                            yield out  # type: ignore[misc]
                    if state.over:
                        break
                if state.done:
                    await drain(batches)
                if not state.count:
                    state.error = state.error or no_events(head, self.name, url)
                for event in self._end(state):
                    yield event
            finally:
                await resp.aclose()
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception as exc:
            yield ErrorEvent(await self._failure(exc, self._where(url), key or NO_KEY, base_url, model_id),
                             unusable_model=unusable_model_error(exc))

    async def _send(self, sdk: Any, url: str, body: dict[str, Any], extra: Mapping[str, Any],
                    sent: list[Any]) -> AsyncIterator[RetryEvent]:
        """POST the request, retrying what `retry.retryable` allows (up to `maxRetries`), and yield each retry's
        events; the open response is appended to `sent`, the last failure raised."""
        retries = self.settings.max_retries
        for attempt in range(retries + 1):  # 0: the request itself, n: its n-th retry
            try:
                sent.append(await raw_stream(sdk, url, body, extra))
            except (asyncio.CancelledError, KeyboardInterrupt):
                raise
            except Exception as exc:
                failure = retryable(exc)
                if failure is None:
                    raise
                if attempt == retries:
                    if retries:
                        yield RetryEvent(RETRY_GAVE_UP, retries, retries, status_code=failure.status_code,
                                         error=failure.error)
                    raise
                delay = retry_delay(exc, attempt + 1)
                yield RetryEvent(RETRY_SCHEDULED, attempt + 1, retries, int(delay * 1000), failure.status_code,
                                 failure.error)
                await asyncio.sleep(delay)
            else:
                if attempt:
                    yield RetryEvent(RETRY_SUCCEEDED, attempt, retries)
                return

    async def _failure(self, exc: Exception, where: Where, key: str, base_url: str, model_id: str) -> str:
        """One line naming the provider, the cause of a failed call and the fix."""
        return describe(exc, where, model_id)

    # ---- what each provider supplies ---------------------------------------------------------------

    def _body(self, request: CompletionRequest) -> dict[str, Any]:
        raise NotImplementedError

    def _state(self, model_id: str, base_url: str) -> StreamState:
        return StreamState(model_id, base_url)

    def _data(self, data: bytes, state: Any) -> Parsed:
        """The event(s) of one ``data:`` payload; sets ``state.over`` to stop reading."""
        raise NotImplementedError

    def _end(self, state: Any) -> list[ProviderEvent]:
        """The last events: usage not yet sent, then how the stream ended (a StopEvent or an ErrorEvent)."""
        raise NotImplementedError
