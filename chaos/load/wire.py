"""The shard protocol's wire format: one JSON object per line over TCP, and codecs for what it carries.

JSON, never pickle: a coordinator must not run code a peer on the network sends it, and a shard
must not either. Client rules travel as ``{"type": <one of the known rule classes>, ...fields}``;
load settings and stream records as their dataclass fields. Each line is bounded
(``MAX_LINE_BYTES``; a hello, read before the peer has proved anything, ``HELLO_MAX_BYTES``) and
decoded by a bounded parser (``decode``): nesting at most ``MAX_DEPTH`` deep, numbers finite
(Python's own bound refuses an integer of more than 4,300 digits), text UTF-8 (no lone surrogate, which
would jam the coordinator's journal). A peer that sends more, or something that is not such a JSON
object, is a ``ProtocolError`` and its connection is closed.

Messages (``op``), shard → coordinator: ``hello`` {token, index, count, version, pid, host},
``pong`` {seq, t0, t1, t2}, ``record`` {record}, ``reply`` {seq, ok, value, lag, stats}.
Coordinator → shard: ``welcome`` {config}, ``refused`` {why}, ``ping`` {seq, t0}, ``offset``
{offset_ns, bound_ns}, ``phase`` {name}, ``rules`` {rules}, ``call`` {seq, cmd, args}.
"""

from __future__ import annotations

import array
import asyncio
import json
import math
import re
from dataclasses import asdict, fields
from itertools import accumulate
from typing import Any

from chaos.load.workload import LoadSettings, PromptSettings
from chaos.load.workloads import WorkloadSettings
from chaos.model.client_rules import DisconnectRule, SlowReaderRule, TimeoutRule
from chaos.model.context import ClientRule
from chaos.model.errors import ChaosError

__all__ = [
    "ACTIVITY_EVERY_S",
    "HELLO_MAX_BYTES",
    "MAX_DEPTH",
    "MAX_LINE_BYTES",
    "PROTOCOL_VERSION",
    "ProtocolError",
    "decode",
    "encode",
    "read_message",
    "rule_from_json",
    "rule_to_json",
    "rules_from_json",
    "settings_from_json",
    "settings_to_json",
]

PROTOCOL_VERSION = 2  # 2: shards report their in-flight streams' last-byte stamps (op activity)
ACTIVITY_EVERY_S = 0.5  # how often a load process reports when its in-flight streams last got a byte
MAX_LINE_BYTES = 8 * 1024 * 1024  # a record with a long text and thousands of token stamps fits many times over
# before the token is checked a peer is nobody: its hello (~200 bytes) is read with this limit, so an
# unauthenticated connection holds at most about twice this much of the coordinator's memory
HELLO_MAX_BYTES = 16 * 1024
MAX_DEPTH = 32  # a record nests 3 deep (record → usage → its details); deeper is not the protocol
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string, escapes included: its brackets are text
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # \ud800-\udfff: one half of a pair, maybe alone
_SIGNED = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # an opening bracket +1, a closing one -1 (signed bytes)
_RULES: dict[str, type[ClientRule]] = {cls.__name__: cls for cls in (DisconnectRule, SlowReaderRule, TimeoutRule)}


class ProtocolError(ChaosError):
    """A peer sent something that is not the shard protocol."""

    exit_code = 4


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"


async def read_message(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next message, or None at the end of the stream."""
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise ProtocolError("the peer closed the connection in the middle of a message") from None
        return None
    except asyncio.LimitOverrunError as exc:
        raise ProtocolError(f"a message longer than this connection's limit ({exc.consumed} bytes "
                            "without a newline)") from None
    message = decode(line)
    if not isinstance(message, dict) or not isinstance(message.get("op"), str):
        raise ProtocolError("a message that is not a JSON object with an 'op'")
    return message


def decode(line: bytes) -> Any:
    """One JSON value from a peer, bounded: at most ``MAX_DEPTH`` deep, finite numbers only.

    ``json.loads`` alone turns ``1e999`` into ``inf`` (an ``OverflowError`` later, in ``int()``),
    ``NaN`` into a float that compares with nothing, a 4,300-digit integer into a ``ValueError`` and
    deep nesting into a ``RecursionError``: each killed the coordinator's reader of that shard and
    left it counted alive. Everything wrong here is a ``ProtocolError``. (Integers are not checked
    here, which would cost a Python call per token stamp: ``chaos.load.shard_records`` bounds a
    record's.)"""
    try:
        value = json.loads(line, parse_constant=_no_constant, parse_float=_finite)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise ProtocolError(f"a message that is not JSON within the protocol's bounds: {exc}") from None
    if _depth(line) > MAX_DEPTH:  # after the parse: the C parser refuses garbage (and 1,000 levels) sooner
        raise ProtocolError(f"a message nested more than {MAX_DEPTH} deep")
    if _SURROGATE_ESCAPE.search(line) is not None and not _utf8(value):  # a C scan: other lines cost nothing
        raise ProtocolError("a message with a lone UTF-16 surrogate (a \\ud800 escape): not text any file can hold")
    return value


def _utf8(value: Any) -> bool:
    """Whether every string of ``value`` (keys included) is UTF-8 text: a JSON ``"\\ud800"`` decodes to a str
    that no UTF-8 journal can be written with, which would jam the coordinator's journal."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _depth(line: bytes) -> int:
    """How deep the brackets of ``line`` nest, outside its strings: C-speed scans (8 MiB of brackets
    in about 0.3 s), never a Python loop per byte."""
    brackets = _STRING.sub(b"", line).translate(_SIGNED, _NOT_BRACKETS)
    return max(accumulate(array.array("b", brackets)), default=0)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number the protocol carries")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is not a finite number")
    return value


def rule_to_json(rule: ClientRule) -> dict[str, Any]:
    if type(rule).__name__ not in _RULES:
        raise ProtocolError(f"client rule {type(rule).__name__} cannot be sent to a shard")
    return {"type": type(rule).__name__, **asdict(rule)}  # type: ignore[call-overload]  # a dataclass, as every rule


def rule_from_json(data: dict[str, Any]) -> ClientRule:
    cls = _RULES.get(str(data.get("type")))
    if cls is None:
        raise ProtocolError(f"unknown client rule type {data.get('type')!r}")
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]  # a dataclass, as every rule
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in names}
    try:
        return cls(**values)
    except TypeError as exc:
        raise ProtocolError(f"client rule {cls.__name__}: {exc}") from None


def rules_from_json(items: list[dict[str, Any]]) -> dict[str, ClientRule]:
    rules = [rule_from_json(item) for item in items]
    return {rule.fault: rule for rule in rules}


def settings_to_json(settings: LoadSettings) -> dict[str, Any]:
    return asdict(settings)


def settings_from_json(data: dict[str, Any]) -> LoadSettings:
    try:
        prompts = dict(data["prompts"])
        prompts["mix"] = tuple(tuple(pair) for pair in prompts.get("mix", ()))
        values = {k: v for k, v in data.items() if k in {f.name for f in fields(LoadSettings)}}
        values["prompts"] = PromptSettings(**prompts)
        values["max_tokens"] = tuple(values["max_tokens"])
        values["headers"] = tuple((str(k), v) for k, v in values.get("headers", ()))
        if values.get("connect_backoff") is not None:
            values["connect_backoff"] = tuple(float(x) for x in values["connect_backoff"])
        if "workload" in values:  # (a coordinator from before workload kinds sends none: single)
            values["workload"] = WorkloadSettings.from_json(dict(values["workload"]))
        values["tools"] = tuple(dict(t) for t in values.get("tools", ()))
        return LoadSettings(**values)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"load settings the shard cannot read: {exc!r}") from None
