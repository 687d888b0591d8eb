"""The ``scripted`` provider: deterministic model scripts for tests, the demo and benchmarks (no network).

Model name: ``scripted/<script>`` where ``<script>`` is a script registered with
``register_script(name, script)`` (or passed to ``ProviderRegistry(scripts=…)``), the built-in ``echo``,
or a path to a ``.yaml`` / ``.yml`` / ``.json`` file (absolute, or relative to the session cwd).

Script format (YAML or JSON; the same structure as an inline dict)::

    turns:                    # the n-th model call of a session uses turns[n], where n is the number of
                              # assistant messages already in the conversation (so a resumed session
                              # continues where it left off, and every call — rule replies included —
                              # advances the sequence)
      - text: "Let me look."          # assistant text, streamed in `chunks` deltas
        thinking: "hmm"               # optional thinking block
        tool_calls:                   # optional; executed by the session
          - name: bash
            arguments: {command: ls}  # an object; or `arguments_raw: "{bad json"` to send raw text
            id: call_1                # optional (default: call_<turn>_<i>)
        usage: {input: 120, output: 30, cacheRead: 0, cacheWrite: 0, cost: 0.0012}
                                      # optional; default: ~chars/4 of the request and the reply
        delay_ms: 0                   # wait before the first event
        chunk_delay_ms: 0             # wait between streamed chunks
        chunks: 1                     # split `text` into this many deltas
        stop_reason: stop             # default: toolUse with tool calls, else stop; `length` = truncated
      - error: "rate limited"         # the call fails (transcript stopReason "error"); with `text` the
        text: "partial"               # text streams first, then the error (a stream broken mid-way)
      - empty: true                   # an empty generation on every attempt (the retries run out)
      - empty_attempts: 2             # the first 2 attempts are empty, the 3rd returns the rest
        text: "finally"
      - hang: true                    # never completes (until the session aborts the turn)
    rules:                    # checked first, in order; the first match replies instead of turns[n]
      - match: "REVIEW"               # regular expression searched in the latest message's text
        on: user                      # user | toolResult | any (default any): which latest message
        reply: {text: "VERDICT: approve"}   # a turn object as above
    default: {text: "done"}   # used when turns are exhausted; without it an exhausted script is an error

Unknown keys anywhere are errors naming the location and the legal keys, and so is a key given twice
in one mapping (naming the file, the line and the key). A turn (or a rule's reply) may also be a plain
string: its text. The built-in ``scripted/echo`` answers ``echo: <latest text>``. The ``attempt``
counter behind ``empty_attempts`` is the session's empty-generation retry number.

A script file is read off the event loop (a pool hosts many sessions on one loop), only if it is a
regular file of at most ``MAX_SCRIPT_BYTES``, opened non-blocking: a FIFO named ``x.yaml`` — any agent
can make one — or a kernel stream behind a symlink is refused, never waited on. It is parsed
again only when it changed (same path, inode, size and modification time: the cached script).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import stat
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from legion.workers.providers.base import (
    CompletionRequest,
    ErrorEvent,
    ProviderError,
    ProviderEvent,
    StopEvent,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
    ToolCallStart,
    UsageEvent,
)
from legion.workers.tools.fileops import kind

_TURN_KEYS = {"text", "thinking", "tool_calls", "usage", "delay_ms", "chunk_delay_ms", "chunks", "stop_reason",
              "error", "empty", "empty_attempts", "hang"}
_CALL_KEYS = {"name", "arguments", "arguments_raw", "id"}
_USAGE_KEYS = {"input", "output", "cacheRead", "cacheWrite", "cost"}
_RULE_KEYS = {"match", "on", "reply"}
_SCRIPT_KEYS = {"turns", "rules", "default"}
_STOP_REASONS = {"stop", "length", "toolUse"}


@dataclass(frozen=True)
class ScriptCall:
    name: str
    arguments_json: str
    id: str | None = None


@dataclass(frozen=True)
class ScriptTurn:
    text: str = ""
    thinking: str = ""
    tool_calls: tuple[ScriptCall, ...] = ()
    usage: Mapping[str, float] | None = None
    delay_ms: float = 0.0
    chunk_delay_ms: float = 0.0
    chunks: int = 1
    stop_reason: str | None = None
    error: str | None = None
    empty: bool = False
    empty_attempts: int = 0
    hang: bool = False


@dataclass(frozen=True)
class ScriptRule:
    pattern: re.Pattern[str]
    on: str
    reply: ScriptTurn


@dataclass(frozen=True)
class Script:
    turns: tuple[ScriptTurn, ...] = ()
    rules: tuple[ScriptRule, ...] = ()
    default: ScriptTurn | None = None


def _check_keys(obj: Any, legal: set[str], where: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise ProviderError(f"scripted: {where} must be a mapping, got {type(obj).__name__}")
    unknown = sorted(str(k) for k in set(obj) - legal)
    if unknown:
        raise ProviderError(f"scripted: {where}: unknown key {unknown[0]!r}; legal keys: {', '.join(sorted(legal))}")
    return obj


def _num(obj: dict[str, Any], key: str, where: str, default: float = 0.0) -> float:
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ProviderError(f"scripted: {where}.{key} must be a non-negative number, got {value!r}")
    return float(value)


def _str(obj: dict[str, Any], key: str, where: str) -> str:
    value = obj.get(key, "")
    if not isinstance(value, str):
        raise ProviderError(f"scripted: {where}.{key} must be a string, got {type(value).__name__}")
    return value


def _parse_call(obj: Any, where: str) -> ScriptCall:
    d = _check_keys(obj, _CALL_KEYS, where)
    name = d.get("name")
    if not isinstance(name, str) or not name:
        raise ProviderError(f"scripted: {where}.name must be a non-empty string")
    if "arguments_raw" in d:
        raw = d["arguments_raw"]
        if not isinstance(raw, str):
            raise ProviderError(f"scripted: {where}.arguments_raw must be a string")
    else:
        args = d.get("arguments", {})
        if not isinstance(args, dict):
            raise ProviderError(f"scripted: {where}.arguments must be a mapping (use arguments_raw for raw text)")
        raw = json.dumps(args)
    cid = d.get("id")
    if cid is not None and not isinstance(cid, str):
        raise ProviderError(f"scripted: {where}.id must be a string")
    return ScriptCall(name, raw, cid)


def parse_turn(obj: Any, where: str = "turn") -> ScriptTurn:
    """Validate one turn object (see the module docstring)."""
    if isinstance(obj, str):
        return ScriptTurn(text=obj)
    d = _check_keys(obj, _TURN_KEYS, where)
    calls = d.get("tool_calls", [])
    if not isinstance(calls, list):
        raise ProviderError(f"scripted: {where}.tool_calls must be a list")
    usage = d.get("usage")
    if usage is not None:
        u = _check_keys(usage, _USAGE_KEYS, f"{where}.usage")
        usage = {k: _num(u, k, f"{where}.usage") for k in u}
    stop = d.get("stop_reason")
    if stop is not None and stop not in _STOP_REASONS:
        raise ProviderError(f"scripted: {where}.stop_reason must be one of {sorted(_STOP_REASONS)}, got {stop!r}")
    error = d.get("error")
    if error is not None and not isinstance(error, str):
        raise ProviderError(f"scripted: {where}.error must be a string")
    chunks = d.get("chunks", 1)
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise ProviderError(f"scripted: {where}.chunks must be an integer >= 1")
    empty_attempts = d.get("empty_attempts", 0)
    if isinstance(empty_attempts, bool) or not isinstance(empty_attempts, int) or empty_attempts < 0:
        raise ProviderError(f"scripted: {where}.empty_attempts must be an integer >= 0")
    return ScriptTurn(
        text=_str(d, "text", where), thinking=_str(d, "thinking", where),
        tool_calls=tuple(_parse_call(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(calls)),
        usage=usage, delay_ms=_num(d, "delay_ms", where), chunk_delay_ms=_num(d, "chunk_delay_ms", where),
        chunks=chunks, stop_reason=stop, error=error, empty=bool(d.get("empty", False)),
        empty_attempts=empty_attempts, hang=bool(d.get("hang", False)))


def parse_script(obj: Any, where: str = "script") -> Script:
    """Validate a whole script (a dict as loaded from YAML/JSON)."""
    d = _check_keys(obj, _SCRIPT_KEYS, where)
    turns = d.get("turns", [])
    rules = d.get("rules", [])
    if not isinstance(turns, list) or not isinstance(rules, list):
        raise ProviderError(f"scripted: {where}.turns and {where}.rules must be lists")
    parsed_rules = []
    for i, r in enumerate(rules):
        rw = f"{where}.rules[{i}]"
        if isinstance(r, dict) and True in r and "on" not in r:
            r = {("on" if k is True else k): v for k, v in r.items()}  # YAML 1.1 reads a bare `on:` key as true
        rd = _check_keys(r, _RULE_KEYS, rw)
        on = rd.get("on", "any")
        if on not in ("user", "toolResult", "any"):
            raise ProviderError(f"scripted: {rw}.on must be user, toolResult or any, got {on!r}")
        try:
            pattern = re.compile(_str(rd, "match", rw))
        except re.error as exc:
            raise ProviderError(f"scripted: {rw}.match is not a valid regular expression: {exc}") from exc
        if "reply" not in rd:
            raise ProviderError(f"scripted: {rw} needs a reply")
        parsed_rules.append(ScriptRule(pattern, on, parse_turn(rd["reply"], f"{rw}.reply")))
    default = parse_turn(d["default"], f"{where}.default") if d.get("default") is not None else None
    return Script(tuple(parse_turn(t, f"{where}.turns[{i}]") for i, t in enumerate(turns)),
                  tuple(parsed_rules), default)


MAX_SCRIPT_BYTES = 4 * 1024 * 1024  # a script file larger than this is refused
SCRIPT_LOAD_TIMEOUT_S = 10.0  # a script file not read by then (a hung mount) fails the model call


# libyaml's parser when PyYAML was built with it (~10× faster: a 1,000-node bench tree's lead scripts took ~0.3 s
# of the pool's CPU to parse in pure Python); the constructor, and so the duplicate-key check, is the same
_SafeLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _UniqueKeyLoader(_SafeLoader):
    """The safe YAML loader, except that a key given twice in one mapping is an error, not a silent overwrite."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` merges; its keys may be overridden
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the base loader reports it
                    continue
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"duplicate key {key!r} (first given on line {first + 1})", key_node.start_mark)
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"duplicate key {key!r}")
        seen[key] = value
    return seen


def read_script_file(path: Path) -> str:
    """The text of a script file, refused without blocking unless it is a regular file of at most
    ``MAX_SCRIPT_BYTES`` whose read does not block."""
    where = f"scripted: cannot read script {path}"
    try:
        st = os.stat(path)  # stat never opens: a FIFO is known before an open could wait for a writer
        if not stat.S_ISREG(st.st_mode):
            raise ProviderError(f"scripted: script {path} is {kind(st.st_mode)}, not a regular file; a scripted "
                                "model reads a .yaml/.yml/.json file")
        if st.st_size > MAX_SCRIPT_BYTES:
            raise ProviderError(f"scripted: script {path} is {st.st_size} bytes, over the "
                                f"{MAX_SCRIPT_BYTES // (1024 * 1024)} MiB limit for a script")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ProviderError(f"{where}: {exc.strerror}") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced between the stat and the open
            raise ProviderError(f"scripted: script {path} is not a regular file")
        data = b""
        while len(data) <= MAX_SCRIPT_BYTES and (chunk := os.read(fd, MAX_SCRIPT_BYTES + 1 - len(data))):
            data += chunk
    except BlockingIOError as exc:
        raise ProviderError(f"scripted: script {path} blocks on read (a kernel stream, not a file); "
                            "give a .yaml/.yml/.json file") from exc
    except OSError as exc:
        raise ProviderError(f"{where}: {exc.strerror}") from exc
    finally:
        os.close(fd)
    if len(data) > MAX_SCRIPT_BYTES:
        raise ProviderError(f"scripted: script {path} is over the {MAX_SCRIPT_BYTES // (1024 * 1024)} MiB "
                            "limit for a script")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProviderError(f"scripted: script {path} is not UTF-8 text (byte {exc.start})") from exc


def _script_path(source: str | Path, cwd: str | None) -> Path:
    path = Path(source)
    return Path(cwd) / path if not path.is_absolute() and cwd else path


def load_script(source: str | Path | Mapping[str, Any], cwd: str | None = None) -> Script:
    """Load a script from an inline mapping or a YAML/JSON file (blocking: see ``load_script_file``)."""
    if isinstance(source, Mapping):
        return parse_script(dict(source))
    path = _script_path(source, cwd)
    raw = read_script_file(path)
    try:
        if path.suffix == ".json":
            obj = json.loads(raw, object_pairs_hook=_unique_pairs)
        else:
            obj = yaml.load(raw, Loader=_UniqueKeyLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        at = f"line {mark.line + 1}: " if mark is not None else ""
        raise ProviderError(f"scripted: {path} is not valid YAML: {at}{exc.problem or exc}") from exc
    except (ValueError, yaml.YAMLError) as exc:
        raise ProviderError(f"scripted: {path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
                            f"{exc}") from exc
    return parse_script(obj, where=str(path))


_file_cache: dict[str, tuple[tuple[int, int, int, int], Script]] = {}
_loader: ThreadPoolExecutor | None = None


def _load_file_cached(path: Path) -> Script:
    """``load_script`` of a file, parsed again only when it changed (blocking: run off the loop)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ProviderError(f"scripted: cannot read script {path}: {exc.strerror}") from exc
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    cached = _file_cache.get(str(path))
    if cached is not None and cached[0] == key:
        return cached[1]
    script = load_script(path)
    _file_cache[str(path)] = (key, script)
    return script


async def load_script_file(source: str | Path, cwd: str | None = None) -> Script:
    """Load a script file off the event loop, on the scripted provider's own threads (a read that hangs
    can hold only those), bounded by ``SCRIPT_LOAD_TIMEOUT_S``."""
    global _loader
    path = _script_path(source, cwd)
    if _loader is None:
        _loader = ThreadPoolExecutor(2, thread_name_prefix="script-load")
    future = asyncio.get_running_loop().run_in_executor(_loader, _load_file_cached, path)
    try:
        return await asyncio.wait_for(future, SCRIPT_LOAD_TIMEOUT_S)
    except TimeoutError:
        raise ProviderError(f"scripted: reading script {path} did not finish within "
                            f"{SCRIPT_LOAD_TIMEOUT_S:g} s") from None


_registry: dict[str, Script] = {}


def register_script(name: str, script: Script | Mapping[str, Any]) -> None:
    """Make ``scripted/<name>`` available process-wide."""
    _registry[name] = script if isinstance(script, Script) else load_script(script)


def _latest(messages: list[dict[str, Any]]) -> tuple[str, str]:
    from legion.workers.transcript import text_of

    for msg in reversed(messages):
        role = msg.get("role")
        if role in ("user", "toolResult"):
            return str(role), text_of(msg)
    return "", ""


def _estimate_tokens(messages: list[dict[str, Any]], system: str) -> int:
    from legion.workers.transcript import text_of

    return (len(system) + sum(len(text_of(m)) for m in messages)) // 4 + 1


@dataclass
class ScriptedProvider:
    """Serves scripts; stateless per session (the position comes from the conversation itself)."""

    scripts: dict[str, Script] = field(default_factory=dict)
    name: str = "scripted"
    api: str = "scripted"

    def script_for(self, model_id: str, cwd: str | None = None) -> Script:
        """The script of ``scripted/<model_id>`` (a file is read here: blocking — ``stream`` reads it off the loop)."""
        named = self._named(model_id)
        return named if named is not None else load_script(model_id, cwd)

    def _named(self, model_id: str) -> Script | None:
        """A registered or built-in script; None for a script file; unknown names raise."""
        if model_id in self.scripts:
            return self.scripts[model_id]
        if model_id in _registry:
            return _registry[model_id]
        if model_id == "echo":
            return Script(rules=(ScriptRule(re.compile(r"(?s).*"), "any", ScriptTurn(text="\x00echo")),))
        if model_id.endswith((".yaml", ".yml", ".json")):
            return None
        known = sorted({*self.scripts, *_registry, "echo"})
        raise ProviderError(f"scripted: unknown script {model_id!r}; known scripts: {', '.join(known)} "
                            "(or give a path ending in .yaml/.yml/.json)")

    def pick(self, script: Script, messages: list[dict[str, Any]]) -> ScriptTurn | None:
        role, text = _latest(messages)
        for rule in script.rules:
            if (rule.on == "any" or rule.on == role) and rule.pattern.search(text):
                if rule.reply.text == "\x00echo":
                    return ScriptTurn(text=f"echo: {text}")
                return rule.reply
        index = sum(1 for m in messages if m.get("role") == "assistant")
        if index < len(script.turns):
            return script.turns[index]
        return script.default

    async def stream(self, request: CompletionRequest) -> AsyncIterator[ProviderEvent]:
        try:
            script = self._named(request.model.model_id)
            if script is None:
                script = await load_script_file(request.model.model_id, request.cwd)
        except ProviderError as exc:
            yield ErrorEvent(str(exc))
            return
        turn = self.pick(script, request.messages)
        if turn is None:
            n = sum(1 for m in request.messages if m.get("role") == "assistant")
            yield ErrorEvent(f"scripted: script {request.model.model_id!r} exhausted after {n} turn{'' if n == 1 else 's'} "
                             "and has no default")
            return
        async for event in self._play(turn, request):
            yield event

    async def _play(self, turn: ScriptTurn, request: CompletionRequest) -> AsyncIterator[ProviderEvent]:
        if turn.delay_ms:
            await asyncio.sleep(turn.delay_ms / 1000)
        if turn.hang:
            await asyncio.Event().wait()
        if turn.empty or request.attempt < turn.empty_attempts:
            yield UsageEvent(input=_estimate_tokens(request.messages, request.system_prompt), output=0)
            yield StopEvent("stop")
            return
        if turn.thinking:
            yield ThinkingDelta(turn.thinking)
        if turn.text:
            size = -(-len(turn.text) // turn.chunks)
            for i in range(0, len(turn.text), size):
                if i and turn.chunk_delay_ms:
                    await asyncio.sleep(turn.chunk_delay_ms / 1000)
                yield TextDelta(turn.text[i:i + size])
        if turn.error is not None:
            yield ErrorEvent(turn.error)
            return
        index = sum(1 for m in request.messages if m.get("role") == "assistant")
        for i, call in enumerate(turn.tool_calls):
            yield ToolCallStart(i, call.id or f"call_{index}_{i}", call.name)
            yield ToolCallDelta(i, call.arguments_json)
        u = turn.usage or {}
        yield UsageEvent(
            input=int(u.get("input", _estimate_tokens(request.messages, request.system_prompt))),
            output=int(u.get("output", len(turn.text) // 4 + 1)), cache_read=int(u.get("cacheRead", 0)),
            cache_write=int(u.get("cacheWrite", 0)), cost_usd=float(u.get("cost", 0.0)))
        yield StopEvent(turn.stop_reason or ("toolUse" if turn.tool_calls else "stop"))
