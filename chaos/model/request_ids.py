"""The load's per-request ids as they go on the wire: a UUID-shaped ``X-Request-Id`` that stands for
one readable record id (``StreamRecord.id``) and carries the run it belongs to. Pure.

Some servers refuse an ``X-Request-Id`` that is not a UUID (llama-cpp-python answers HTTP 400), so
the load sends ``wire_id(record_id, run)`` in place of its readable ids (``load.request_ids: uuid``,
the default; ``sequence`` sends the record ids themselves). Reports and evidence keep the record ids;
whatever reads an id back off the wire (the stream hops' taps, their rules' evidence) turns it into
the record id with ``record_id_of``, so taps pair with streams exactly as they did with the old ids.

The layout (RFC 9562: version nibble ``4``, variant nibble ``8``; lower-case hex)::

    RRRRRRRR-WWWW-4FFF-8XXX-NNNNNNNNNNNN
    run tag  |    form |   number
             worker    extra

- ``R``: the run's tag, 32 bits (``run_tag(seed, start)``): two runs' ids differ, and one run's
  requests are found in a gateway's log by their first 8 hex digits;
- ``F``: which record id it stands for, ``W`` (16 bits), ``X`` (12 bits) and ``N`` (48 bits) its parts:

  ======  =======================  ===================  ==========  ======================
  ``F``   record id                ``W``                ``X``       ``N``
  ======  =======================  ===================  ==========  ======================
  000     ``W-N`` (a request)      worker               0           request number
  001     ``W-sK-tT`` / ``-rA``    worker               resend A    session K (32), turn T (16)
  002     ``W-bg-C`` (background)  worker               0           the worker's C-th stream
  003     ``survival-L-S-HHHHHH``  label L (``LABELS``)  0           probe S (24), HHHHHH (24)
  004     ``L`` (a label alone)    label L (``LABELS``)  0           0
  ======  =======================  ===================  ==========  ======================

So ``0-1362`` of run ``1a2b3c4d`` goes out as ``1a2b3c4d-0000-4000-8000-000000000552``. An id the
layout does not describe (another client's, a gateway's own UUID) is not ours: ``record_id_of`` gives
it back unchanged, and so does it an id not in the canonical form that ``wire_id`` writes.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import dataclass

__all__ = ["FORMATS", "LABELS", "RUN_OWN", "RequestIds", "is_uuid4", "record_id_of", "run_of", "run_tag", "wire_id"]

FORMATS = ("uuid", "sequence")  # ``load.request_ids``
# the words an id may name (forms 003 and 004) by their index: the preflight's, the survival probe's labels
# (append only: an index is on the wire); keep_alive_probe: the runner's keep-alive probe (chaos.load.keepalive)
LABELS = ("preflight", "baseline", "hold", "hold_keepalive", "silence", "silence_keepalive", "deadline",
          "keep_alive_probe")
# requests the run sends for itself, not the load's: the stream hops' taps of them are not the load's streams
RUN_OWN = frozenset({"preflight", "keep_alive_probe"})

_MAX_RUN = 2**32 - 1
_MAX_WORKER = 2**16 - 1
_MAX_N = 2**48 - 1
_MAX_X = 2**12 - 1
_MAX_24 = 2**24 - 1
_NUM = r"(0|[1-9][0-9]*)"  # a number in its one spelling, so that every id round-trips
_SEQUENCE = re.compile(rf"{_NUM}-{_NUM}")
_SESSION = re.compile(rf"{_NUM}-s{_NUM}-t{_NUM}(?:-r([1-9][0-9]*))?")
_BACKGROUND = re.compile(rf"{_NUM}-bg-{_NUM}")
_SURVIVAL = re.compile(rf"survival-([a-z_]+)-{_NUM}-([0-9a-f]{{6}})")
_WIRE = re.compile(r"([0-9a-f]{8})-([0-9a-f]{4})-4([0-9a-f]{3})-8([0-9a-f]{3})-([0-9a-f]{12})")


def run_tag(seed: int, start: object = "") -> int:
    """The run's 32-bit tag: from its seed and what tells this start of it from another (the journal's
    run id, a clock reading); the same arguments, the same tag."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{start}".encode()).digest()[:4], "big")


def _bounded(what: str, value: int, most: int, record_id: str | None) -> int:
    if not 0 <= value <= most:
        whose = f"request id {record_id!r}: " if record_id is not None else ""
        raise ValueError(f"{whose}{what} {value} is out of range 0..{most} for a UUID-shaped id")
    return value


def _label(name: str, record_id: str) -> int:
    if name not in LABELS:
        raise ValueError(f"request id {record_id!r}: label {name!r} is none of {', '.join(LABELS)}")
    return LABELS.index(name)


def _parts(record_id: str) -> tuple[int, int, int, int]:
    """(form, W, X, N) of a record id; ValueError when no form describes it."""
    if m := _SEQUENCE.fullmatch(record_id):
        return 0, _bounded("worker", int(m[1]), _MAX_WORKER, record_id), 0, _bounded(
            "request number", int(m[2]), _MAX_N, record_id)
    if m := _SESSION.fullmatch(record_id):
        k = _bounded("session", int(m[2]), _MAX_RUN, record_id)
        turn = _bounded("turn", int(m[3]), _MAX_WORKER, record_id)
        return 1, _bounded("worker", int(m[1]), _MAX_WORKER, record_id), _bounded(
            "resend", int(m[4] or 0), _MAX_X, record_id), k << 16 | turn
    if m := _BACKGROUND.fullmatch(record_id):
        return 2, _bounded("worker", int(m[1]), _MAX_WORKER, record_id), 0, _bounded(
            "background stream", int(m[2]), _MAX_N, record_id)
    if m := _SURVIVAL.fullmatch(record_id):
        probe = _bounded("probe", int(m[2]), _MAX_24, record_id)
        return 3, _label(m[1], record_id), 0, probe << 24 | int(m[3], 16)
    if record_id in LABELS:
        return 4, LABELS.index(record_id), 0, 0
    raise ValueError(f"request id {record_id!r} has no UUID-shaped form: expected W-N, W-sK-tT[-rA], W-bg-C, "
                     f"survival-LABEL-S-HHHHHH or a label ({', '.join(LABELS)})")


def wire_id(record_id: str, run: int) -> str:
    """The UUID-shaped id that stands for ``record_id`` in run ``run`` (``run_tag``); ValueError, naming
    the part and its range, when the layout cannot hold it."""
    _bounded("run tag", run, _MAX_RUN, None)
    form, w, x, n = _parts(record_id)
    return f"{run:08x}-{w:04x}-4{form:03x}-8{x:03x}-{n:012x}"


def _record_id(form: int, w: int, x: int, n: int) -> str | None:
    if form == 0 and x == 0:
        return f"{w}-{n}"
    if form == 1:
        return f"{w}-s{n >> 16}-t{n & 0xFFFF}" + (f"-r{x}" if x else "")
    if form == 2 and x == 0:
        return f"{w}-bg-{n}"
    if form == 3 and x == 0 and w < len(LABELS) and n >> 48 == 0:
        return f"survival-{LABELS[w]}-{n >> 24}-{n & _MAX_24:06x}"
    if form == 4 and x == 0 and n == 0 and w < len(LABELS):
        return LABELS[w]
    return None


def record_id_of(wire: str) -> str:
    """The record id a wire id stands for; any id that is not one of ours (a record id sent as it is,
    another client's or a gateway's UUID) comes back unchanged."""
    m = _WIRE.fullmatch(wire.lower()) if len(wire) == 36 else None
    if m is None:
        return wire
    found = _record_id(int(m[3], 16), int(m[2], 16), int(m[4], 16), int(m[5], 16))
    if found is None or wire_id(found, int(m[1], 16)) != wire.lower():
        return wire
    return found


def run_of(wire: str) -> int | None:
    """The run tag of one of our wire ids; None for any other id."""
    return int(wire[:8], 16) if record_id_of(wire) != wire else None


@dataclass(frozen=True)
class RequestIds:
    """How one load names its requests on the wire: ``uuid`` (``wire_id`` of run ``run``) or
    ``sequence`` (the record ids themselves)."""

    format: str = "uuid"
    run: int = 0

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"request_ids {self.format!r}: expected one of {', '.join(FORMATS)}")
        _bounded("run tag", self.run, _MAX_RUN, None)

    def wire(self, record_id: str) -> str:
        """What the request carries as its ``X-Request-Id``."""
        return wire_id(record_id, self.run) if self.format == "uuid" else record_id


def is_uuid4(text: str) -> bool:
    """Whether ``text`` is a version-4 UUID in its canonical form (what strict validators accept)."""
    try:
        parsed = uuid.UUID(text)
    except ValueError:
        return False
    return parsed.version == 4 and str(parsed) == text.lower()
