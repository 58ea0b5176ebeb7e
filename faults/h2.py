"""HTTP/2 faults: rules on a stream hop that speaks HTTP/2 to its client (``path: [{kind: stream, http: 2}]``,
``chaos/hops/streamhop/h2front.py``), acting on its HTTP/2 streams and connections.

They are stream faults in every other way (``faults.stream.StreamFault``): ``hop:`` names the hop (default:
the path's only stream hop), ``inject`` puts the rule over the hop's control API and returns it as the hop
lists it, ``revert`` deletes it and returns what the hop says it did, rollback deletes it by name. The
hop must speak HTTP/2: a path whose hop does not is a located error at load time (the hop refuses the
rule too). A stream that reached the hop over HTTP/1.1 (the same port serves both) is left alone.

Per stream (``share``: of requests, drawn per request id from the run's seed): ``stream.h2_rst_stream``,
``stream.h2_header_leak``, ``stream.h2_window``'s withheld grants. Per connection: ``stream.h2_goaway``
(``share``: of connections), ``stream.h2_max_streams`` (every connection). A connection rule's evidence
names the connections it acted on (``c3``: the hop's third HTTP/2 connection) where a request rule's
names request ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from chaos.hops.streamhop.rules import H2_ERRORS, H2_LEAK_HOWS, MAX_H2_STREAMS, MAX_H2_WINDOW, MAX_SECONDS
from chaos.model.params import Param, Schema
from chaos.model.units import format_duration
from faults.base import register
from faults.stream import HOP, SHARE, StreamFault, pick_hop

if TYPE_CHECKING:
    from chaos.model.experiment import Experiment

__all__ = ["H2Fault"]

HTTP2 = "2"  # the stream hop's `http:` that these faults need
CONNECTIONS = Param("share", "fraction", 1.0,
                    doc="share of connections it acts on, drawn per connection (c1, c2, ...) from the run's seed")


@dataclass(frozen=True, kw_only=True)
class H2Fault(StreamFault):
    """A rule on a stream hop's HTTP/2 side."""

    def problems(self, experiment: Experiment) -> list[tuple[str, str]]:
        out = super().problems(experiment)
        hop, _ = pick_hop(self.kind, self.hop, experiment.path)
        option = getattr(hop, "option", None)
        if hop is not None and callable(option) and str(option("http", "1.1")) != HTTP2:
            out.append(("hop", f"{self.kind} acts on HTTP/2 streams and stream hop {hop.name!r} speaks HTTP/1.1 to its "
                               "client: give it `http: 2` (and `tls: true` for h2 over TLS, as browsers reach it)"))
        return out


@register
@dataclass(frozen=True, kw_only=True)
class RstStream(H2Fault):
    kind = "stream.h2_rst_stream"
    rule_kind = "h2_rst_stream"
    summary = ("reset one HTTP/2 stream after N events with RST_STREAM and an error code, while the other streams "
               "of its connection go on: what a gateway sends when its upstream breaks off")
    schema = Schema((
        Param("after_events", "int", 1, min=0, doc="events relayed whole before the reset (comments not counted)"),
        Param("error", "choice", "internal_error", choices=H2_ERRORS,
              doc="RST_STREAM's error code: internal_error (what nginx sends when its upstream breaks off), cancel, "
                  "refused_stream, enhance_your_calm, ..."),
        HOP, SHARE,
    ))

    after_events: int
    error: str

    def rule_params(self) -> dict[str, Any]:
        return {"after_events": self.after_events, "error": self.error}

    def effect(self) -> str:
        return (f"after {self.after_events} events the stream is reset (RST_STREAM {self.error.upper()}); the other "
                "streams of its connection go on; the hop closes its upstream connection at once")


@register
@dataclass(frozen=True, kw_only=True)
class Goaway(H2Fault):
    kind = "stream.h2_goaway"
    rule_kind = "h2_goaway"
    summary = ("a graceful GOAWAY: the streams a connection already carries finish, new ones are refused and the "
               "connection closes once they end, so clients reconnect; at once, or after every N streams "
               "(a gateway's reload, or its keepalive_requests)")
    schema = Schema((
        Param("after_streams", "int", None, min=1,
              doc="every connection, open or new, gets it once it has taken this many streams (nginx's "
                  "keepalive_requests); default: the connections open when the phase starts get it at once"),
        HOP, CONNECTIONS,
    ))

    after_streams: int | None

    def rule_params(self) -> dict[str, Any]:
        return {"after_streams": self.after_streams}

    def effect(self) -> str:
        when = (f"every connection, once it has taken {self.after_streams} streams," if self.after_streams
                else "every connection open when the phase starts")
        return (f"{when} gets GOAWAY (NO_ERROR, last stream id: the highest it took): its streams finish, a stream "
                "opened after it is refused (REFUSED_STREAM) and the connection closes when the last one ends; "
                "clients open a new connection")


@register
@dataclass(frozen=True, kw_only=True)
class MaxStreams(H2Fault):
    kind = "stream.h2_max_streams"
    rule_kind = "h2_max_streams"
    stops_at_once = True
    summary = ("lower SETTINGS_MAX_CONCURRENT_STREAMS to N on the connections, open or new (a stream beyond it is "
               "refused with REFUSED_STREAM); reverted, 100 again")
    schema = Schema((
        Param("streams", "int", required=True, min=0, max=MAX_H2_STREAMS,
              doc="the concurrent streams each connection takes (the hop's default: 100)"),
        HOP, CONNECTIONS,
    ))

    streams: int

    def rule_params(self) -> dict[str, Any]:
        return {"streams": self.streams}

    def effect(self) -> str:
        return (f"each connection chosen is told (SETTINGS) that it may carry {self.streams} streams at once; a stream "
                "beyond that is refused (RST_STREAM REFUSED_STREAM) and a client that obeys queues its requests; "
                "when the phase ends the connections are told 100 again")


@register
@dataclass(frozen=True, kw_only=True)
class Window(H2Fault):
    kind = "stream.h2_window"
    rule_kind = "h2_window"
    summary = ("starve request bodies of flow-control window: every connection's streams start with a small window "
               "(SETTINGS_INITIAL_WINDOW_SIZE) and the streams chosen get the rest only after a time: a long prompt "
               "waits to be sent")
    schema = Schema((
        Param("window", "size", required=True, min=0, max=MAX_H2_WINDOW,
              doc="the initial window each stream's request body gets: at most HTTP/2's default, 65,535 bytes "
                  "(what it is without the fault)"),
        Param("seconds", "duration", required=True, max=MAX_SECONDS,
              doc="how long after the stream opened the hop grants a chosen stream more window"),
        HOP, SHARE,
    ))

    window: float
    seconds: float

    def rule_params(self) -> dict[str, Any]:
        return {"bytes": int(self.window), "seconds": self.seconds}

    def effect(self) -> str:
        return (f"each stream may send {int(self.window)} bytes of request body before it needs a WINDOW_UPDATE; a "
                f"chosen stream gets none until {format_duration(self.seconds)} after it opened, so a longer body "
                "(a long prompt) reaches the engine that much later; the others get theirs as the hop reads")


@register
@dataclass(frozen=True, kw_only=True)
class HeaderLeak(H2Fault):
    kind = "stream.h2_header_leak"
    rule_kind = "h2_header_leak"
    summary = ("a planted multiplexing defect: on a connection carrying several streams, a share of event-stream "
               "responses lose their content-type: text/event-stream (dropped, or a neighbour stream's put in its "
               "place): a browser's EventSource refuses them")
    schema = Schema((
        Param("how", "choice", "drop", choices=H2_LEAK_HOWS,
              doc="drop: no content-type at all; neighbour: the content-type of another stream of the connection "
                  "that is not an event stream (application/json where none was sent yet)"),
        HOP, SHARE,
    ))

    how: str

    def rule_params(self) -> dict[str, Any]:
        return {"how": self.how}

    def effect(self) -> str:
        spoiled = ("without a content-type" if self.how == "drop"
                   else "with a neighbour stream's content-type (application/json where there is none)")
        return (f"an event stream's HEADERS, sent while its connection carries other streams, arrive {spoiled}; the "
                "body is unchanged; a stream alone on its connection is left alone")
