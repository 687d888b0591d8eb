"""Provider layer benchmark (issue 14 acceptance): what the provider layer adds to a streamed turn.

A stub server in a child process answers every POST with the same reply (``--chunks`` text deltas plus
usage, kept-alive connections) in the OpenAI chat-completions format (``…/v1/chat/completions``) and the
Anthropic Messages format (``…/v1/messages``), two ways:

- ``paced`` (the gate): the reply streams as a model streams it — ``--per-ms`` events flushed every
  millisecond (4 000 tokens/s by default, 10-40× faster than real models), so a turn is what a user
  waits for;
- ``burst`` (reported): the whole reply in one write — no waiting at all, so the turn time is the
  client's CPU time per turn, the harshest view of the layer's cost.

For each provider and mode, interleaved in the same run:

- baseline: a raw ``httpx`` stream of the same request — POST, read the lines, ``orjson``-parse each
  event (the least any client does);
- provider: ``provider.stream(request)`` of legion's provider (the official SDK's request with its
  auth/retry/error handling, event parsing, tool/usage mapping, genai-prices cost) to the last event;
- reported only (burst): the provider's request through the SDK with the body read but not parsed
  (``sdk_request``) and the same request sent by the SDK's HTTP client without the SDK
  (``http_request``): their difference is the SDK's fixed cost per request (``sdk_fixed_ms``), which
  legion keeps for its auth, retries and typed errors;
- reported only (openai): the SDK's own typed stream objects — why legion parses the stream itself.

Every turn also records the process CPU time it used (``cpu_ms``, ``cpu_ratio``): on a shared machine
the wall time of a burst turn swings with other load, its CPU time much less.

Targets (paced): per streamed turn, provider p50 / baseline p50 ≤ 1.2; first-token p50 − baseline
first-event p50 ≤ 2 ms. Prints one JSON object; exits non-zero when a target is missed.
``--quick`` = fewer rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _stats

TARGET_RATIO = 1.2
TARGET_FIRST_TOKEN_MS = 2.0
ROOT = Path(__file__).resolve().parent.parent


# ---- the stub server (child process) -------------------------------------------------------------

def _openai_body(chunks: int) -> bytes:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": "c", "object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": delta, "finish_reason": finish}]}
    events = [chunk({"role": "assistant", "content": f"token{i} "}) for i in range(chunks)]
    events += [chunk({}, "stop"), {"id": "c", "choices": [], "usage": {"prompt_tokens": 900, "completion_tokens": chunks}}]
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def _anthropic_body(chunks: int) -> bytes:
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant",
                                                                "content": [], "usage": {"input_tokens": 900,
                                                                                         "output_tokens": 1}}}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text",
                                                                                               "text": ""}})]
    events += [("content_block_delta", {"type": "content_block_delta", "index": 0,
                                        "delta": {"type": "text_delta", "text": f"token{i} "}}) for i in range(chunks)]
    events += [("content_block_stop", {"type": "content_block_stop", "index": 0}),
               ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                                  "usage": {"output_tokens": chunks}}),
               ("message_stop", {"type": "message_stop"})]
    return b"".join(f"event: {n}\ndata: {json.dumps(d)}\n\n".encode() for n, d in events)


def _split_events(body: bytes) -> list[bytes]:
    return [e + b"\n\n" for e in body.split(b"\n\n") if e]


async def _serve(chunks: int, per_ms: int) -> None:
    bodies = {"/v1/chat/completions": _openai_body(chunks), "/v1/messages": _anthropic_body(chunks)}
    events = {path: _split_events(body) for path, body in bodies.items()}

    async def paced(writer: asyncio.StreamWriter, parts: list[bytes]) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        for i in range(0, len(parts), per_ms):
            await asyncio.sleep(max(0.0, start + i / per_ms / 1000 - loop.time()))
            writer.write(b"".join(parts[i:i + per_ms]))
            await writer.drain()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                mode, _, path = lines[0].split(" ")[1].removeprefix("/").partition("/")
                length = next((int(v) for k, _, v in (ln.partition(":") for ln in lines[1:])
                               if k.strip().lower() == "content-length"), 0)
                await reader.readexactly(length)
                body = bodies.get("/" + path, b"")
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             + f"Content-Length: {len(body)}\r\n\r\n".encode())
                if mode == "paced":
                    await paced(writer, events.get("/" + path, []))
                else:
                    writer.write(body)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes stdin


# ---- measurement ---------------------------------------------------------------------------------

async def _raw_turn(client: Any, url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[float, float]:
    import orjson

    t0 = time.perf_counter()
    first = 0.0
    async with client.stream("POST", url, json=body, headers=headers) as resp:
        async for line in resp.aiter_lines():
            if line.startswith("data:"):
                if not first:
                    first = time.perf_counter()
                data = line[5:].strip()
                if data != "[DONE]":
                    orjson.loads(data)
    return time.perf_counter() - t0, first - t0


async def _provider_turn(provider: Any, request: Any) -> tuple[float, float]:
    from legion.workers.providers.base import ErrorEvent, TextDelta

    t0 = time.perf_counter()
    first = 0.0
    async for event in provider.stream(request):
        if isinstance(event, TextDelta) and not first:
            first = time.perf_counter()
        elif isinstance(event, ErrorEvent):
            raise RuntimeError(event.message)
    return time.perf_counter() - t0, first - t0


def _provider_body(provider: Any, request: Any) -> dict[str, Any]:
    return provider._body(request) if hasattr(provider, "_body") else provider._params(request)


async def _sdk_request_turn(provider: Any, request: Any, url: str) -> tuple[float, float]:
    """The provider's SDK request with the body read unparsed: what the SDK costs before any parsing."""
    from legion.workers.providers.pool import raw_stream

    t0 = time.perf_counter()
    sdk = provider._pool.sdk("sk-bench", provider.settings.url({}))
    resp = await raw_stream(sdk, url, _provider_body(provider, request), {})
    first = time.perf_counter()
    async for _chunk in resp.aiter_bytes():
        pass
    await resp.aclose()
    return time.perf_counter() - t0, first - t0


async def _http_request_turn(provider: Any, request: Any, url: str, headers: dict[str, str]) -> tuple[float, float]:
    """The same request on the SDK's pooled HTTP client without the SDK (the floor under ``sdk_request``)."""
    import orjson

    t0 = time.perf_counter()
    http = provider._pool.http()
    req = http.build_request("POST", url, content=orjson.dumps(_provider_body(provider, request)),
                             headers={**headers, "Content-Type": "application/json"})
    resp = await http.send(req, stream=True)
    first = time.perf_counter()
    async for _chunk in resp.aiter_bytes():
        pass
    await resp.aclose()
    return time.perf_counter() - t0, first - t0


async def _cpu(coro: Any) -> tuple[float, float, float]:
    """(wall, first, process CPU) seconds of one turn."""
    c0 = time.process_time()
    wall, first = await coro
    return wall, first, time.process_time() - c0


async def _sdk_typed_turn(sdk: Any) -> tuple[float, float]:
    t0 = time.perf_counter()
    first = 0.0
    stream = await sdk.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}],
                                               stream=True)
    async for _chunk in stream:
        if not first:
            first = time.perf_counter()
    return time.perf_counter() - t0, first - t0


def _ms(values: list[float]) -> dict[str, float]:
    s = _stats.summary([v * 1000 for v in values], count=True)
    return {"p50": round(s["median"], 3), "p95": round(s["p95"], 3), "n": s["n"]}


def _cases(base: str) -> dict[str, tuple[str, str, str, dict[str, Any], dict[str, str]]]:
    """provider -> (legion model, provider base URL, raw URL, raw JSON body, raw headers)."""
    return {
        "openai": ("openai/gpt-4o", f"{base}/v1", f"{base}/v1/chat/completions",
                   {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
                   {"Authorization": "Bearer sk-bench"}),
        "anthropic": ("anthropic/claude-sonnet-4-5", base, f"{base}/v1/messages",
                      {"model": "claude-sonnet-4-5", "max_tokens": 1024, "stream": True,
                       "messages": [{"role": "user", "content": "hi"}]},
                      {"x-api-key": "sk-bench", "anthropic-version": "2023-06-01"}),
    }


async def _measure_mode(port: int, mode: str, rounds: int, warmup: int) -> dict[str, Any]:
    import httpx
    import openai

    from legion.workers.providers.base import CompletionRequest, parse_model_ref
    from legion.workers.providers.pi_models import PiModels
    from legion.workers.providers.registry import ProviderRegistry

    base = f"http://127.0.0.1:{port}/{mode}"
    cases = _cases(base)
    reg = ProviderRegistry({name: {"baseUrl": case[1]} for name, case in cases.items()}, pi_models=PiModels())
    env = {"OPENAI_API_KEY": "sk-bench", "ANTHROPIC_API_KEY": "sk-bench"}
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}], "timestamp": 0}]
    raw = httpx.AsyncClient(timeout=30)
    sdk = openai.AsyncOpenAI(api_key="sk-bench", base_url=f"{base}/v1", max_retries=0)
    out: dict[str, Any] = {}
    for name, (model, _base, url, body, headers) in cases.items():
        provider, _ref = reg.resolve(model)
        request = CompletionRequest(parse_model_ref(model), "", messages, [], 0, env)
        samples: dict[str, list[tuple[float, float, float]]] = {k: [] for k in (
            "raw", "provider", "sdk_request", "http_request", "sdk_typed")}
        for i in range(warmup + rounds):
            turns = [("raw", _raw_turn(raw, url, body, headers)), ("provider", _provider_turn(provider, request))]
            if mode == "burst":
                turns += [("sdk_request", _sdk_request_turn(provider, request, url)),
                          ("http_request", _http_request_turn(provider, request, url, headers))]
            if i % 2:
                turns.reverse()  # interleave the order so drift hits every variant alike
            for key, coro in turns:
                result = await _cpu(coro)
                if i >= warmup:
                    samples[key].append(result)
        if name == "openai" and mode == "burst":  # apart: its garbage (pydantic objects) would tax the others' GC
            for i in range(warmup + rounds):
                result = await _cpu(_sdk_typed_turn(sdk))
                if i >= warmup:
                    samples["sdk_typed"].append(result)
        out[name] = _figures({k: v for k, v in samples.items() if v})
    await raw.aclose()
    await sdk.close()
    await reg.aclose()
    return out


def _figures(samples: dict[str, list[tuple[float, float, float]]]) -> dict[str, Any]:
    total = {k: _ms([t for t, _, _ in v]) for k, v in samples.items()}
    first = {k: _ms([f for _, f, _ in v]) for k, v in samples.items()}
    cpu = {k: _ms([c for _, _, c in v]) for k, v in samples.items()}
    out: dict[str, Any] = {
        "turn_ms": total, "first_token_ms": first, "cpu_ms": cpu,
        "ratio": round(total["provider"]["p50"] / total["raw"]["p50"], 3),
        "cpu_ratio": round(cpu["provider"]["p50"] / cpu["raw"]["p50"], 3),
        "added_first_token_ms": round(first["provider"]["p50"] - first["raw"]["p50"], 3),
    }
    if "sdk_request" in total:
        out["sdk_fixed_ms"] = round(total["sdk_request"]["p50"] - total["http_request"]["p50"], 3)
        out["sdk_fixed_cpu_ms"] = round(cpu["sdk_request"]["p50"] - cpu["http_request"]["p50"], 3)
    if "sdk_typed" in total:
        out["sdk_typed_ratio"] = round(total["sdk_typed"]["p50"] / total["raw"]["p50"], 3)
    return out


async def _measure(port: int, quick: bool) -> dict[str, Any]:
    paced = (20, 5) if quick else (100, 10)
    burst = (40, 10) if quick else (300, 30)
    return {"paced": await _measure_mode(port, "paced", *paced), "burst": await _measure_mode(port, "burst", *burst)}


def _misses(paced: dict[str, Any]) -> list[str]:
    missed = []
    for name, r in paced.items():
        if r["ratio"] > TARGET_RATIO:
            missed.append(f"{name}: paced turn ratio {r['ratio']} > {TARGET_RATIO}")
        if r["added_first_token_ms"] > TARGET_FIRST_TOKEN_MS:
            missed.append(f"{name}: added first token {r['added_first_token_ms']} ms > {TARGET_FIRST_TOKEN_MS} ms")
    return missed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="a short smoke run")
    ap.add_argument("--chunks", type=int, default=200, help="text deltas per streamed reply")
    ap.add_argument("--per-ms", type=int, default=4, help="events per millisecond in the paced mode")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        asyncio.run(_serve(args.chunks, args.per_ms))
        return 0
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen([sys.executable, __file__, "--serve", "--chunks", str(args.chunks),
                               "--per-ms", str(args.per_ms)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        results = asyncio.run(_measure(port, args.quick))
    finally:
        if server.stdin is not None:
            server.stdin.close()
        try:
            server.wait(5)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    missed = _misses(results["paced"])
    report = {"benchmark": "providers", "chunks_per_turn": args.chunks, "paced_events_per_ms": args.per_ms,
              "baseline": "raw httpx stream: POST, aiter_lines, orjson per event",
              "targets": {"paced_ratio_max": TARGET_RATIO, "added_first_token_ms_max": TARGET_FIRST_TOKEN_MS},
              "paced": results["paced"], "burst_reported": results["burst"], "missed": missed, "ok": not missed}
    print(json.dumps(report))
    return 0 if not missed else 1


if __name__ == "__main__":
    sys.exit(main())
