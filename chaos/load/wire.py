"""The shard protocol's wire format: one JSON object per line over TCP, and codecs for what it carries.

JSON, never pickle: a coordinator must not run code a peer on the network sends it, and a shard
must not either. Client rules travel as ``{"type": <one of the known rule classes>, ...fields}``;
load settings and stream records as their dataclass fields. Each line is bounded
(``MAX_LINE_BYTES``); a peer that sends more, or something that is not a JSON object, is a
``ProtocolError`` and its connection is closed.

Messages (``op``), shard → coordinator: ``hello`` {token, index, count, version, pid, host},
``pong`` {seq, t0, t1, t2}, ``record`` {record}, ``reply`` {seq, ok, value, lag, stats}.
Coordinator → shard: ``welcome`` {config}, ``refused`` {why}, ``ping`` {seq, t0}, ``offset``
{offset_ns, bound_ns}, ``phase`` {name}, ``rules`` {rules}, ``call`` {seq, cmd, args}.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, fields
from typing import Any

from chaos.load.workload import LoadSettings, PromptSettings
from chaos.model.client_rules import DisconnectRule, SlowReaderRule, TimeoutRule
from chaos.model.context import ClientRule
from chaos.model.errors import ChaosError

__all__ = [
    "ACTIVITY_EVERY_S",
    "MAX_LINE_BYTES",
    "PROTOCOL_VERSION",
    "ProtocolError",
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
    except asyncio.LimitOverrunError:
        raise ProtocolError(f"a message longer than {MAX_LINE_BYTES} bytes") from None
    try:
        message = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"a message that is not JSON: {exc}") from None
    if not isinstance(message, dict) or not isinstance(message.get("op"), str):
        raise ProtocolError("a message that is not a JSON object with an 'op'")
    return message


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
        return LoadSettings(**values)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"load settings the shard cannot read: {exc!r}") from None
