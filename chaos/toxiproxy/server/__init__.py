"""Embedded Toxiproxy: an asyncio server API-compatible with Toxiproxy 2.12.0.

The server a run starts unless it is named another (``proxy.server: auto`` with no URL): guarded by
the run's token (``guard``), so network faults act on real TCP connections through a Toxiproxy only
the run configures. Stdlib only. ``/version`` reports ``2.12.0``.

Modules: ``api`` (HTTP API), ``proxy`` (listeners, connection pump), ``link`` (per-direction
toxic chain), ``toxics`` (one class per toxic), ``server`` (:class:`EmbeddedToxiproxy`,
:class:`ToxiproxyThread`, :func:`main`).

Toxics: ``latency`` (latency, jitter ms), ``bandwidth`` (rate KB/s), ``slow_close`` (delay ms),
``timeout`` (timeout ms), ``reset_peer`` (timeout ms), ``slicer`` (average_size, size_variation
bytes, delay µs), ``limit_data`` (bytes), ``noop``, and the non-standard ``buffer`` (max_bytes,
max_time ms; 0 = unlimited): holds bytes until the source closes or a limit is hit, then flushes
(a response-buffering reverse proxy: TTFT equals end-to-end latency). ``buffer`` does not exist
in real Toxiproxy (it answers 400 ``invalid toxic type``).

Where the real server crashes or misbehaves on attribute values, this one never crashes.
Values are stored and echoed back as sent; "clamp" means they are interpreted as below at use:

=============  =========================  ======================================  ==========================
toxic          value                      real Toxiproxy 2.12.0                   embedded
=============  =========================  ======================================  ==========================
bandwidth      ``rate`` = 0 (default)     stream stalls forever                   clamp: unlimited (no delay)
bandwidth      ``rate`` < 0               whole server crashes (slice panic)      clamp: unlimited (no delay)
slicer         ``average_size`` <= 0      whole server dies (stack overflow)      clamp: treated as 1
slicer         ``size_variation`` large   may panic (slice bounds, #541)          clamp: split point kept
                                                                                  inside the chunk
slicer         ``size_variation`` < 0     treated as 0                            same
slicer         ``delay`` < 0              no pause                                same (0)
latency        total <= 0, jitter < 0     no delay / no jitter                    same
timeout        ``timeout`` <= 0           never closes, black-holes data          same
reset_peer     ``timeout`` < 0            immediate                               same
slow_close     ``delay`` < 0              no delay                                same
limit_data     ``bytes`` <= 0             closes on the first chunk               same
any            ``toxicity`` > 1 or < 0    accepted (always / never)               same
buffer         ``max_bytes``/``max_time``  (no such toxic)                         reject: 400
               < 0                                                                ``invalid attribute ...``
=============  =========================  ======================================  ==========================

Other deliberate differences: the upstream dial does not block the accept loop; API handlers
never hang (removing a ``reset_peer`` mid-countdown returns at once, the countdown still runs);
toxicity is drawn per connection and toxic on every (re)start of its stage, from seeded
generators; half-close is not preserved (a FIN from either side closes the connection, as in Go);
``/metrics`` is always 404 (as the real server without metrics flags).
"""

from .api import VERSION
from .server import EmbeddedToxiproxy, ToxiproxyThread, main

__all__ = ["VERSION", "EmbeddedToxiproxy", "ToxiproxyThread", "main"]
