"""A stream record from a shard, checked field by field before anything of the run reads it.

A shard (or its journal shard, which a pod may write on a shared volume) is another process, maybe
another host: what it sends is data to check, never a record to trust. ``from_json`` alone builds a
``StreamRecord`` from whatever types it is given, and a ``t_sent`` that is a string or a
``t_content`` that is a number then crashed judging with a traceback. ``stream_record`` returns the
record only when every field has its declared type (integers within ±2^62 ns, so moving them by a
clock offset stays exact and numpy's int64 holds them), else raises ``ProtocolError`` naming the
field.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any

from chaos.load.wire import ProtocolError
from chaos.model.observations import ErrorInfo, Hangup, StreamRecord, from_json

__all__ = ["figures", "ints", "numbers", "stream_record"]

INT_BOUND = 2**62  # stamps are ns on a monotonic clock (about 2^60 after 36 years up); offsets are added to them
USAGE_DEPTH = 2  # usage → prompt_tokens_details → cached_tokens: OpenAI's deepest


def _is_int(value: Any) -> bool:
    return type(value) is int and -INT_BOUND < value < INT_BOUND  # bool is not an int here


def _ints(values: list[Any]) -> bool:
    """Every item an int within the bound: C-speed (a record may carry thousands of token stamps)."""
    return not values or (set(map(type, values)) == {int} and -INT_BOUND < min(values) and max(values) < INT_BOUND)


def ints(values: list[Any]) -> bool:
    """Whether every item of ``values`` is an int within ±``INT_BOUND`` (a bool is not one here). Pure."""
    return _ints(values)


def _is_str(value: Any) -> bool:
    return type(value) is str


def _optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or check(value)


def _scalar(value: Any) -> bool:
    # the JSON decoder already refused non-finite floats (chaos.load.wire.decode)
    return value is None or type(value) in (str, bool, float) or _is_int(value)


def _usage(value: Any, depth: int = 0) -> bool:
    """``usage``: an object of scalars and (at most ``USAGE_DEPTH`` deep) objects of them."""
    if type(value) is not dict or depth > USAGE_DEPTH:
        return False
    return all(type(k) is str and (_scalar(v) or _usage(v, depth + 1)) for k, v in value.items())


def _required(cls: type[Any]) -> set[str]:
    """The fields of dataclass ``cls`` that have no default."""
    return {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}


def _nested(cls: type[Any], checks: dict[str, Callable[[Any], bool]]) -> Callable[[Any], bool]:
    """A nested record (``error``, ``hangup``) as an object: each field of ``cls`` with its check;
    those without a default must be there."""
    required = _required(cls)

    def check(value: Any) -> bool:
        return (type(value) is dict and required <= value.keys() <= checks.keys()
                and all(checks[k](v) for k, v in value.items()))

    return check


_BY_ANNOTATION: dict[str, Callable[[Any], bool]] = {
    "str": _is_str,
    "int": _is_int,
    "bool": lambda value: type(value) is bool,
    "bool | None": _optional(lambda value: type(value) is bool),
    "str | None": _optional(_is_str),
    "int | None": _optional(_is_int),
    "list[int]": lambda value: type(value) is list and _ints(value),
    "dict[str, Any] | None": _optional(_usage),
    "ErrorInfo | None": _optional(_nested(ErrorInfo, {"kind": _is_str, "message": _is_str,
                                                      "status": _optional(_is_int), "cause": _optional(_is_str)})),
    "Hangup | None": _optional(_nested(Hangup, {"fault": _is_str, "reason": _is_str, "t": _is_int})),
}
# every field of StreamRecord, by its declared type: a field added there with a new kind of type
# fails here, at import, rather than passing unchecked
_CHECKS: dict[str, Callable[[Any], bool]] = {f.name: _BY_ANNOTATION[str(f.type)] for f in fields(StreamRecord)}
_REQUIRED = _required(StreamRecord)


def stream_record(body: Any) -> StreamRecord:
    """The ``StreamRecord`` that ``body`` (a decoded JSON object) describes, or ``ProtocolError`` naming
    what is wrong. Keys it does not know are ignored, as ``from_json`` ignores them."""
    if type(body) is not dict:
        raise ProtocolError(f"a stream record that is not an object but {type(body).__name__}")
    if body.get("type", "stream") != "stream":
        raise ProtocolError(f"a {str(body.get('type'))[:40]!r} record where a stream record belongs")
    missing = _REQUIRED - body.keys()
    if missing:
        raise ProtocolError(f"a stream record without {', '.join(sorted(missing))}")
    for name, check in _CHECKS.items():
        if name in body and not check(body[name]):
            raise ProtocolError(f"stream record {str(body.get('id'))[:60]!r}: field {name} is "
                                f"{type(body[name]).__name__} {str(body[name])[:40]!r}, not {_declared(name)}")
    record = from_json({**body, "type": "stream"})
    assert isinstance(record, StreamRecord)
    return record


def _declared(name: str) -> str:
    declared = next(str(f.type) for f in fields(StreamRecord) if f.name == name)
    return f"{declared} (integers within ±2^62)" if "int" in declared else declared


def numbers(value: Any, what: str) -> list[float]:
    """A list of finite numbers from a shard's reply (lag, send delays), or ``ProtocolError``."""
    if type(value) is not list or not all(type(v) is float or _is_int(v) for v in value):
        raise ProtocolError(f"{what}: expected a list of numbers, got {str(value)[:40]!r}")
    return [float(v) for v in value]


def figures(stats: Any) -> dict[str, Any]:
    """A shard's counters as ``summed_stats`` adds them: numbers (no bool) and the names of its loops;
    anything else is dropped (a figure, not a reason to lose the shard)."""
    if type(stats) is not dict:
        return {}
    out: dict[str, Any] = {k: v for k, v in stats.items() if (type(v) is float or _is_int(v)) and k != "loops"}
    loops = stats.get("loops")
    if type(loops) is list:
        out["loops"] = [str(kind)[:64] for kind in loops]
    return out
