"""The parameter schemas of the experiment's own sections (proxy, load, safety, ...; `target:` is drawn from
the target kinds, ``chaos.targets.registry.target_schema``)."""

from __future__ import annotations

from chaos.model.experiment import PROMPT_CLASSES
from chaos.model.params import Param, Schema

__all__ = [
    "ALLOWED_TARGETS",
    "CAPACITY",
    "CONNECT_BACKOFF",
    "FAULT_ENTRY_KEYS",
    "GATEWAY_KEYS",
    "KUBERNETES",
    "KUBERNETES_ACCESS",
    "LOAD",
    "PATH_HOP_KEYS",
    "PATH_KINDS",
    "PATH_STREAM",
    "PATH_TOXIPROXY",
    "PATH_URL",
    "PHASE",
    "PHASE_DURATION",
    "PROMPTS",
    "PROXY",
    "SAFETY",
    "SLA_ENTRY_KEYS",
    "TOP_LEVEL",
    "TRACE_LAYOUTS",
    "UNTIL_DECIDED_FACTOR",
    "WORKLOAD",
    "WORKLOAD_KINDS",
]

# `until: decided` beside a scalar duration d: the phase runs from d up to this many times d
UNTIL_DECIDED_FACTOR = 10.0

TOP_LEVEL = Schema((
    Param("name", "str", required=True, doc="the experiment's name, shown in reports"),
    Param("description", "str", "", doc="what the experiment shows"),
    Param("seed", "int", 0, doc="seeds prompts, client faults and sampling, so a run replays"),
    Param("target", "mapping", doc="the system under test"),
    Param("proxy", "mapping", doc="deprecated: Toxiproxy between load and target (a path of one toxiproxy hop); "
                                  "the section's presence turns it on"),
    Param("path", "mapping", doc="the hops between load and target, load side first: a list of {kind, name?, ...}"),
    Param("load", "mapping", doc="the streaming load"),
    Param("phases", "mapping", required=True, doc="the timeline: a list of {name, duration, faults}"),
    Param("sla", "mapping", doc="a list of verifier entries {kind, name?, phases?, expect?, ...budgets}"),
    Param("safety", "mapping", doc="hard bounds on the run"),
    Param("capacity", "mapping", doc="`streamchaos capacity`: the highest load meeting every SLA, per fault"),
))

# `target:` is the target kinds' own (chaos.targets.registry.target_schema, each kind's `section`); its
# `kubernetes:` mapping, which the loader parses for kind kubernetes, is here.
KUBERNETES_ACCESS = ("auto", "service", "endpoints", "port-forward")

# `port` (a number or a port name) is parsed by the loader itself.
KUBERNETES = Schema((
    Param("namespace", "str", None,
          doc="the namespace of the target's pods; default the kubeconfig context's, or the runner pod's own"),
    Param("service", "str", None,
          doc="the Service in front of the pods: its selector finds them, its port is the target's"),
    Param("selector", "mapping", None, doc="pod labels (matchLabels), instead of or besides a Service"),
    Param("access", "choice", "auto", choices=KUBERNETES_ACCESS,
          doc="how the load reaches the pods: the Service's ClusterIP (in the cluster), each ready pod's IP "
              "(endpoints, in the cluster), or port-forward through the API server; auto: service in a pod, else "
              "port-forward"),
    Param("kubeconfig", "str", None,
          doc="kubeconfig file; default $KUBECONFIG, ~/.kube/config, then the pod's service account"),
    Param("context", "str", None, doc="kubeconfig context; default its current-context"),
    Param("path", "str", "/v1", doc="the OpenAI API root on the pods"),
))

PROXY_SERVERS = ("auto", "embedded", "binary", "docker", "external")
SERVER_DOC = ("which Toxiproxy server to use; auto: the one `url` (or TOXIPROXY_URL) names, else the embedded one, "
              "whose API answers only the run; binary and docker only when named: their API answers every local user")

PROXY = Schema((
    Param("enabled", "bool", True, doc="false keeps the section but runs without the proxy"),
    Param("server", "choice", "auto", choices=PROXY_SERVERS, doc=SERVER_DOC),
    Param("url", "str", None, doc="Toxiproxy API URL for server external (TOXIPROXY_URL also counts)"),
    Param("name", "str", "streamchaos", doc="the proxy's name on the Toxiproxy server"),
    Param("listen", "str", "127.0.0.1:0", doc="where the proxy listens; 0.0.0.0:PORT for a Toxiproxy in another pod "
                                              "(clients then use the API URL's host)"),
))

# `path:`: a list of hops, load side first. The gateway kinds' own keys are their `options` schema
# (chaos.hops.gateways.base.GATEWAY_KINDS); these are the other kinds' and the keys every hop takes.
PATH_KINDS = ("stream", "toxiproxy", "url")  # besides the gateway kinds
PATH_HOP_KEYS = ("kind", "name")

PATH_STREAM = Schema((
    Param("kind", "str", required=True),
    Param("name", "str", None, doc="the hop's name in the path (faults and verifiers name it); default: stream"),
    Param("tap", "bool", True, doc="record what it received and forwarded, per request (the relay verifier)"),
    Param("http", "choice", "1.1", choices=("1.1", "2"),
          doc="2: it speaks HTTP/2 to its client too (h2 by ALPN with tls, h2c with prior knowledge without), "
              "each stream relayed, faulted and tapped as a request; the stream.h2.* faults need it"),
    Param("tls", "bool", False, doc="serve TLS with the run's own certificate (its CA trusted by the load): "
                                    "the hop's URL is https"),
))

PATH_URL = Schema((
    Param("kind", "str", required=True),
    Param("name", "str", None, doc="the hop's name in the path; default: url"),
    Param("url", "str", required=True, doc="the base URL of a gateway you run, e.g. http://127.0.0.1:8080/v1"),
))

PATH_TOXIPROXY = Schema((
    Param("kind", "str", required=True),
    Param("name", "str", None, doc="the hop's name, and the proxy's on the Toxiproxy server; default: toxiproxy "
                                   "(the proxy: streamchaos)"),
    Param("server", "choice", "auto", choices=PROXY_SERVERS, doc=SERVER_DOC),
    Param("url", "str", None, doc="Toxiproxy API URL for server external (TOXIPROXY_URL also counts)"),
    Param("listen", "str", "127.0.0.1:0", doc="where the proxy listens"),
))

# every gateway hop takes these besides its kind's options
GATEWAY_KEYS = ("kind", "name", "config")

PROMPTS = Schema((
    Param("source", "str", "synthetic",
          doc="synthetic, or a JSONL file (relative to the experiment) of {prompt} or {messages}"),
    Param("min_chars", "int", 16, min=1, doc="shortest synthetic prompt"),
    Param("max_chars", "int", 128, min=1, doc="longest synthetic prompt"),
    Param("mix", "mapping", None, doc=f"fractions of character classes ({', '.join(PROMPT_CLASSES)}), summing to 1"),
))

LOAD = Schema(
    (
        Param("endpoint", "choice", "completions", choices=("completions", "chat"), doc="which OpenAI endpoint"),
        Param("model", "str", None, doc="the request's model; default: the target's"),
        Param("concurrency", "int", None, min=1, doc="closed loop: streams kept in flight (default 4)"),
        Param("rate", "rate", None, doc="open loop: request arrivals per second"),
        Param("burstiness", "float", 1.0, doc="Gamma shape of inter-arrival times; 1 = Poisson"),
        Param("max_requests", "int", None, min=1, doc="stop after this many requests"),
        Param("max_tokens", "int_or_range", (32, 32), min=1, doc="tokens to generate: n or [low, high]"),
        Param("temperature", "float", 0.0, min=0, max=2, doc="sampling temperature"),
        Param("ignore_eos", "bool", True, doc="generate exactly max_tokens (vLLM, SGLang, llama.cpp, builtin); left "
                                              "out where the engine refuses it"),
        Param("include_usage", "bool", True, doc="ask for stream_options.include_usage"),
        Param("request_timeout", "duration", 30.0, doc="client timeout for one request"),
        Param("workers", "int", 1, min=1, max=64, doc="load generator processes"),
        Param("process", "choice", "own", choices=("own", "runner"),
              doc="own: the generator in a process of its own on uvloop even with one worker (nothing of the "
                  "runner's shares its loop); runner: on the runner's event loop, one process less to start"),
        # 20ms, not the 5ms a dedicated load host could hold: on a 2-core machine that also runs the
        # builtin engine, the generator's loop routinely wakes 5-15ms late at light load (measured).
        # A flagged run only turns a timing failure inconclusive when the lag could explain it.
        Param("lag_threshold", "duration", 0.020, doc="generator event-loop lag p99 above this flags the run"),
        Param("prompts", "mapping", None, doc="prompt source and shape"),
        Param("headers", "mapping", None,
              doc="request headers added to (or, by name, replacing) the OpenAI Python SDK's "
              "defaults, Accept-Encoding: gzip, deflate included; a header set to null is not sent. Each request "
              "also carries its own X-Request-Id (the hops' taps pair by it) unless this names it: "
              "{X-Request-Id: null} to send none"),
        Param("request_ids", "choice", "uuid", choices=("uuid", "sequence"),
              doc="each request's own X-Request-Id: uuid, UUID-shaped (version 4, as llama-cpp-python and other "
                  "strict servers demand), its first 8 hex digits the run's tag (grep a gateway's log for the "
                  "run); sequence: the record id itself (0-17: worker 0's 18th request)"),
        Param("shards", "int", 1, min=1, max=256,
              doc="split the load across this many generator shards, each a process "
              "(here or a pod) that writes a journal shard; merged and judged as one run"),
        Param("shard_launch", "choice", "local", choices=("local", "external"),
              doc="local: the runner starts the shards; external: they are started elsewhere (`streamchaos shard`, an "
                  "Indexed Job)"),
        Param("shard_listen", "str", "127.0.0.1:0", doc="host:port the coordinator listens on for its shards"),
        Param("shard_connect_timeout", "duration", 60.0, doc="how long to wait for every shard to connect"),
        Param("connect_backoff", "mapping", None,
              doc="closed loop: while nothing serves (a connection refused or unreachable, an HTTP 502/503/504, a "
                  "connection closed with no response) a client waits {initial: 500ms, max: 8s, multiplier: 2} "
                  "(the default, as the OpenAI SDK; each wait cut by up to 25% at random) before it sends again, "
                  "reset by any other answer (a 500 included); off: a fixed 50ms pause after a connect error only"),
        Param("workload", "mapping", None,
              doc="what the requests are: {kind: single | sessions | shared_prefix | trace, ...} (docs/workloads.md); "
                  "default single, one prompt per request"),
        Param("tools", "mapping", None, doc="a list of OpenAI tool definitions sent in every chat request"),
        Param("tool_choice", "str", None,
              doc="auto | required | none, or {type: function, function: {name}}: sent with tools in chat requests"),
        Param("http", "mapping", None,
              doc="the protocol of the load: {version: 1.1 | 2 | auto, streams_per_connection: 100, window: 64KiB, "
                  "keep_alive: auto | on | off} "
                  "(2: HTTP/2, h2 by ALPN over https, h2c with prior knowledge over http; auto: what ALPN picks)"),
        Param("reasoning", "bool", None,
              doc="false: chat requests ask for no reasoning (chat_template_kwargs.enable_thinking false); "
                  "unset: nothing sent"),
    ),
    at_most_one_of=(("concurrency", "rate"),),
)

# `load.workload:` (chaos.load.workloads; docs/workloads.md): the keys of each kind, `kind` included
WORKLOAD_KINDS = ("single", "sessions", "shared_prefix", "trace")
TRACE_LAYOUTS = ("mooncake", "sharegpt")
_KIND = Param("kind", "choice", "single", choices=WORKLOAD_KINDS, doc="the workload kind")
WORKLOAD = {
    "single": Schema((_KIND,)),
    "sessions": Schema((
        _KIND,
        Param("turns", "int_or_range", (4, 4), min=1, max=1000, doc="turns per session: n or [low, high], seeded"),
        # a duration or [low, high] of durations: parsed by the loader
        Param("think_time", "str", None,
              doc="the user's pause between a reply's end and the next turn: a duration or [low, high]; default 0s"),
        Param("on_cut", "choice", "resume", choices=("resume", "end"),
              doc="a turn that failed or was cut: resume (the session goes on, resending that turn) or end "
                  "(the slot starts a new session)"),
        Param("system_chars", "int", 0, min=0, doc="a system message of this many characters, shared by every "
              "session (0: none)"),
    )),
    "shared_prefix": Schema((
        _KIND,
        Param("prefixes", "int", 4, min=1, max=100_000, doc="how many distinct shared prefixes (P)"),
        Param("prefix_tokens", "int", None, min=1,
              doc="each prefix's length in the target's tokens (needs its tokenizer: the builtin stack, a vllm "
                  "model directory)"),
        Param("prefix_chars", "int", None, min=1,
              doc="each prefix's length in characters, where no tokenizer is known"),
        Param("suffix_chars", "int_or_range", (16, 64), min=1,
              doc="each request's own suffix after its prefix: n or [low, high] characters"),
    ), at_most_one_of=(("prefix_tokens", "prefix_chars"),)),
    "trace": Schema((
        _KIND,
        Param("path", "str", required=True, doc="the trace file, relative to the experiment file"),
        Param("layout", "choice", "mooncake", choices=TRACE_LAYOUTS,
              doc="mooncake: JSONL {timestamp, input_length, output_length, hash_ids}, replayed at its timestamps; "
                  "sharegpt: conversations, replayed as sessions"),
        Param("speed", "float", 1.0, doc="replay speed: timestamps are divided by it (2: twice as fast)"),
        Param("block_tokens", "int", 512, min=1, doc="tokens one hash_id stands for (Mooncake's 512)"),
        Param("max_output_tokens", "int", 1024, min=1, doc="sharegpt: an answer's length in tokens is capped at this"),
    )),
}

# `load.http:` (chaos.load.http1, chaos.load.http2)
HTTP_VERSIONS = ("1.1", "2", "auto")
KEEP_ALIVE_MODES = ("auto", "on", "off")
HTTP = Schema((
    Param("version", "choice", "1.1", choices=HTTP_VERSIONS,
          doc="1.1; 2: HTTP/2 (ALPN h2 over https, h2c with prior knowledge over http); auto: ALPN decides"),
    Param("streams_per_connection", "int", 100, min=1, max=1000,
          doc="HTTP/2: streams one connection carries at once; the server's SETTINGS_MAX_CONCURRENT_STREAMS caps it"),
    Param("window", "size", 65_535, min=1024, max=2**31 - 1,
          doc="HTTP/2: each stream's receive window (SETTINGS_INITIAL_WINDOW_SIZE); a slow reader stops "
              "granting it, so the server stalls on that stream alone"),
    Param("keep_alive", "choice", "auto", choices=KEEP_ALIVE_MODES,
          doc="HTTP/1.1 connection reuse: auto (reuse, unless a probe before the load finds the server closes "
              "connections after a streamed response; then one connection per request, said on the console); "
              "on (reuse whatever the server leaves open: requests it loses count as errors); off (never)"),
))

# `load.connect_backoff:` (chaos.load.backoff); `off` (or false) turns it off
CONNECT_BACKOFF = Schema((
    Param("initial", "duration", 0.5, doc="the first wait after a connect error"),
    Param("max", "duration", 8.0, doc="no wait is longer"),
    Param("multiplier", "float", 2.0, min=1.0, max=10.0, doc="each wait in a row this many times the one before"),
))

PHASE = Schema((
    Param("name", "str", required=True, doc="unique phase name"),
    Param("duration", "duration", required=True,
          doc="how long the phase lasts; or {min, max}: at least min, then until every verdict judged on it is "
              "decided, at most max (chaos.execution.sequential)"),
    Param("until", "choice", None, choices=("decided",),
          doc="decided: a scalar duration is the minimum, and the phase runs until its verdicts decide, at most "
              f"{UNTIL_DECIDED_FACTOR:g}x it"),
    Param("faults", "mapping", None, doc="a list of fault entries {kind, name?, ...params}"),
))

# `duration: {min, max}`: a phase that runs until decided, from min to max
PHASE_DURATION = Schema((
    Param("min", "duration", required=True, doc="the phase runs at least this long (its planned length)"),
    Param("max", "duration", required=True, doc="and at most this long, however undecided its verdicts are"),
))

SAFETY = Schema((
    Param("max_duration", "duration", 600.0, doc="hard stop for the whole run"),
    Param("drain_timeout", "duration", 10.0, doc="after the last phase: wait for in-flight streams"),
    Param("cleanup_window", "duration", 2.0, doc="then keep scraping metrics this long"),
    Param("allow_gpu_clock_changes", "bool", False,
          doc="gpu.throttle (nvml) and gpu.power_cap refuse to run without it"),
    Param("scrape_interval", "duration", 0.2, doc="metric scrape period, 100ms to 1s"),
    Param("allowed_targets", "mapping", None, doc="where beyond this host's loopback the run may act: "
          "{hosts, namespaces, selectors}; without it remote targets and cluster faults are refused"),
    Param("halt_on_dead_target", "bool", True,
          doc="stop the run when the first 20 streams all fail, or >= 95% fail over 2s, or none of 3 or more "
              "got an answer over 10s"),
    Param("min_fault_coverage", "fraction", 0.9, doc="a fault in force for less than this share of its phase's planned "
          "time on the phase's clock, inject returned to revert began (a hard stop, a halt), makes the run an "
          "error (exit 4)"),
    Param("stop_when", "mapping", None, doc="the fleet's own signals, read before the run starts and while it runs: "
          "a list of {source: prometheus | alertmanager, ...} (docs/fleet-signals.md)"),
    Param("lever", "mapping", None, doc="the fleet lever every run checks: {file, namespace, configmap, kubeconfig, "
          "context, every} (docs/lever.md); the host file is checked even without this section"),
))

# safety.stop_when: a list of {source, ...}; each source's own keys (chaos.fleet.stop_when)
STOP_SOURCES = ("prometheus", "alertmanager")
_STOP_COMMON = (
    Param("source", "str", required=True),
    Param("name", "str", None, doc="how halts, notes and the stop_when verdict call it (default: the source)"),
    Param("every", "duration", 5.0, min=0.1, doc="read the source this often while the run runs"),
    Param("bearer_token_env", "str", None, doc="the environment variable holding a bearer token sent with each read"),
    Param("timeout", "duration", 3.0, min=0.1, doc="one read's time limit"),
    Param("unreachable_halt", "duration", 30.0, min=0.0,
          doc="while the run runs, no answer from the source for this long halts it (0: never; before the run, "
              "no answer refuses it)"),
)
STOP_WHEN = {
    "prometheus": Schema((
        *_STOP_COMMON,
        Param("prometheus_url", "str", required=True, doc="the Prometheus server's root URL (its /api/v1/query)"),
        Param("alerts", "mapping", None, doc="krkn alert-profile entries: a list of {expr, description, severity}"),
        Param("profile", "str", None, doc="a krkn alert-profile file (a YAML list of {expr, description, severity}), "
              "relative to the experiment"),
    )),
    "alertmanager": Schema((
        *_STOP_COMMON,
        Param("alertmanager_url", "str", required=True, doc="the Alertmanager's root URL (its /api/v2/alerts)"),
        Param("matchers", "str_list", required=True,
              doc="label matchers an active, unsilenced alert must all meet to halt the run, e.g. "
                  "severity=~\"critical|page\""),
    )),
}
ALERT_SEVERITIES = ("critical", "error", "warning")
PROM_ALERT = Schema((
    Param("expr", "str", required=True, doc="PromQL; the alert fires while it returns a series (or a non-zero scalar)"),
    Param("description", "str", "", doc="what a halt or note says; {{$value}} and {{$labels.NAME}} are filled in"),
    Param("severity", "choice", "critical", choices=ALERT_SEVERITIES,
          doc="critical: halt and revert (and refuse to start); error: the run fails; warning: recorded"),
))

LEVER = Schema((
    Param("file", "str", None, doc="the host's lever file (default $STREAMCHAOS_LEVER_FILE, else "
          "/var/lib/streamchaos/lever); the lever is engaged while it exists"),
    Param("namespace", "str", None, doc="also check the lever ConfigMap in this Kubernetes namespace"),
    Param("configmap", "str", "streamchaos-lever", doc="the lever ConfigMap's name"),
    Param("kubeconfig", "str", None, doc="the kubeconfig to reach the API server with (default: the usual lookup)"),
    Param("context", "str", None, doc="the kubeconfig context"),
    Param("every", "duration", 1.0, min=0.1, max=60.0, doc="check the lever this often while the run runs"),
))

ALLOWED_TARGETS = Schema((
    Param("hosts", "str_list", (), doc="host names (*.suffix), IPs, CIDRs, host:port or URLs the run may act on"),
    Param("namespaces", "str_list", (), doc="Kubernetes namespaces (* patterns) cluster targets and faults may act in"),
    Param("selectors", "str_list", (), doc="label selectors; a cluster fault's selector must imply one of them"),
))

# safety.halt_on: a list of {kind, ...} conditions (chaos.execution.halt); each kind's own keys.
HALT_KINDS = ("error_share", "ttft", "target_down")
HALT = {
    "error_share": Schema((
        Param("kind", "str", required=True),
        Param("name", "str", None, doc="what the halt reason calls it"),
        Param("above", "fraction", required=True,
              doc="halt when the failed share of the window's streams exceeds this"),
        Param("window", "duration", 5.0, doc="finished streams of the last ... are looked at"),
        Param("min_streams", "int", 10, min=1, doc="fewer finished streams in the window decide nothing"),
    )),
    "ttft": Schema((
        Param("kind", "str", required=True),
        Param("name", "str", None, doc="what the halt reason calls it"),
        Param("above", "duration", required=True, doc="halt when the window's TTFT quantile exceeds this"),
        Param("quantile", "float", 0.9, min=0.01, max=0.999, doc="which quantile of TTFT (0.9 = p90)"),
        Param("window", "duration", 5.0, doc="finished streams of the last ... are looked at"),
        Param("min_streams", "int", 10, min=1, doc="fewer finished streams in the window decide nothing"),
    )),
    "target_down": Schema((
        Param("kind", "str", required=True),
        Param("name", "str", None, doc="what the halt reason calls it"),
        Param("window", "duration", 5.0, doc="halt when for this long no stream that ended got an answer"),
        Param("min_streams", "int", 3, min=1, doc="at least this many streams must have ended unanswered"),
    )),
}

# Keys every fault / SLA entry may carry besides its kind's own parameters.
FAULT_ENTRY_KEYS = ("kind", "name")
SLA_ENTRY_KEYS = ("kind", "name", "phases", "expect", "turns", "when_unobservable")

# capacity: (chaos.capacity) the load level searched for, per case (the baseline and each faulted phase)
CAPACITY = Schema((
    Param("dimension", "choice", "concurrency", choices=("concurrency", "rate"),
          doc="the load searched: closed-loop streams in flight, or open-loop request arrivals per second"),
    Param("min", "float", 1.0, min=1e-3, doc="the lowest level probed (streams, or requests/s)"),
    Param("max", "float", 64.0, min=1e-3, doc="the highest level probed"),
    Param("start", "float", None, min=1e-3, doc="the first level probed; default min"),
    Param("resolution", "fraction", 0.05, min=0.005, max=1.0,
          doc="stop when the lowest failing level is within this of the highest passing one (concurrency: or 1 apart)"),
    Param("probe", "duration", 6.0, min=0.5, doc="one probe's judged window, the case's faults in force"),
    Param("warmup", "duration", 2.0, min=0.0, doc="load before each window, no fault: queues reach steady state"),
    Param("max_probe", "duration", 24.0, min=0.5, doc="an inconclusive probe runs again twice as long, up to this"),
    Param("budget", "duration", 900.0, min=1.0, doc="the whole search's time; exit 3 when it ends first"),
    Param("settle", "duration", 30.0, min=0.0,
          doc="between probes, how long a target may take to go idle (running requests and KV usage back down)"),
    Param("cases", "str_list", (), doc="baseline and phase names; default baseline and every phase with faults"),
    Param("slas", "str_list", (), doc="SLA entry names that must all pass; default every entry judging one window"),
    Param("min_capacity", "float", None, min=0.0, doc="exit 1 when a case's capacity is below it"),
    Param("halt_factor", "float", 3.0, min=0.0,
          doc="a probe stops early, failed, once the TTFT quantile of its streams so far is this many times a ttft "
              "budget (or a quarter of them failed, under errors 0%); 0: never"),
))
