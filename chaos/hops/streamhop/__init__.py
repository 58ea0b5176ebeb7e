"""The embedded stream hop: an asyncio HTTP/1.1 proxy that parses the event stream it relays, faults
it by rules set over its control API, and taps both sides of every request. A product of its own:
it imports nothing else of ours (``python -m chaos.hops.streamhop``).

Modules: ``server`` (the process: ``StreamHop``, the command line, the ready line), ``relay`` (one
request through the hop), ``upstream`` and ``downstream`` (the two sides), ``h2front`` (HTTP/2 to the
client with ``--http 2``: each stream relayed as one request), ``framing`` (the upstream body's
chunked/length/close framing), ``sse`` (events out of bytes), ``rules`` (the rule kinds and their seeded
decisions), ``taps`` (what is recorded per request), ``control`` (the token-guarded control API).

What one hop holds at most, whatever its peers do:

==================================  ==========================================================
request or response head            64 KiB (h11's incomplete-event limit; past it 431 or 502)
one unfinished SSE event            1 MiB (past it the rest of that body is relayed raw, untapped)
bytes queued behind a pause         1 MiB per request (past it the upstream is not read)
socket send buffer to a client      256 KiB per request (past it the upstream is not read)
reads from a socket                 64 KiB at a time
gzip rewrite buffer                 ``gzip_buffer_bytes``, at most 1 MiB
decoded bytes of an encoded body    64 MiB per request for the tap (then it stops parsing)
request body before a status rule   1 MiB read and dropped (past it the connection closes)
tap events                          ``--max-events`` per side per request (default 2048)
rules / rule name                   64 / 128 characters; a rule's request ids: the first 50
control API                         16 KiB head, 64 KiB body, 10 s per request, 64 connections
downstream connections              16,384 at once (more are closed on arrival), HTTP/2 streams counted
HTTP/2 streams per connection       100 at once (SETTINGS_MAX_CONCURRENT_STREAMS; more: REFUSED_STREAM)
HTTP/2 DATA waiting for window      256 KiB per stream (past it the upstream is not read)
HTTP/2 socket send buffer           1 MiB per connection (past it no stream of it sends)
HTTP/2 request head                 64 KiB of header list (h2's MAX_HEADER_LIST_SIZE)
==================================  ==========================================================
"""

from .server import MAX_CONNECTIONS, READY_PREFIX, STOP_GRACE_S, TOKEN_ENV, VERSION, StreamHop, main

__all__ = ["MAX_CONNECTIONS", "READY_PREFIX", "STOP_GRACE_S", "TOKEN_ENV", "VERSION", "StreamHop", "main"]
