"""The parameter schemas of the experiment's own sections (target, proxy, load, safety, ...)."""

from __future__ import annotations

from chaos.params import Param, Schema

from .model import PROMPT_CLASSES

__all__ = [
    "FAULT_ENTRY_KEYS",
    "KUBERNETES",
    "KUBERNETES_ACCESS",
    "LOAD",
    "PHASE",
    "PROMPTS",
    "PROXY",
    "SAFETY",
    "SLA_ENTRY_KEYS",
    "TARGET",
    "TOP_LEVEL",
]

TOP_LEVEL = Schema((
    Param("name", "str", required=True, doc="the experiment's name, shown in reports"),
    Param("description", "str", "", doc="what the experiment shows"),
    Param("seed", "int", 0, doc="seeds prompts, client faults and sampling, so a run replays"),
    Param("target", "mapping", doc="the system under test"),
    Param("proxy", "mapping", doc="Toxiproxy between load and target; the section's presence turns it on"),
    Param("load", "mapping", doc="the streaming load"),
    Param("phases", "mapping", required=True, doc="the timeline: a list of {name, duration, faults}"),
    Param("sla", "mapping", doc="a list of verifier entries {kind, name?, phases?, expect?, ...budgets}"),
    Param("safety", "mapping", doc="hard bounds on the run"),
))

TARGET_KINDS = ("builtin", "openai", "vllm", "docker", "kubernetes")

TARGET = Schema((
    Param("kind", "choice", "builtin", choices=TARGET_KINDS, doc="which system under test"),
    Param("url", "str", None, doc="OpenAI API root, e.g. http://host:8000/v1 (or --target-url at run time)"),
    Param("metrics_url", "str", None, doc="Prometheus endpoint; default <url without /v1>/metrics"),
    Param("model", "str", "tiny", doc="builtin: tiny or a checkpoint directory; otherwise the served model name"),
    Param("device", "str", "auto", doc="builtin engine device: auto, cpu, cuda or cuda:N"),
    Param("kv_blocks", "int", 512, min=1, doc="builtin: KV cache blocks per layer"),
    Param("block_size", "int", 16, min=1, doc="builtin: tokens per KV block"),
    Param("max_num_seqs", "int", 64, min=1, doc="builtin: most sequences in one batch"),
    Param("max_model_len", "int", 1024, min=2, doc="builtin: prompt plus generated tokens"),
    Param("startup_timeout", "duration", 60.0, doc="how long the target may take to answer /health"),
    Param("api_key", "str", None, doc="bearer token sent with every request"),
    Param("admin_token", "str", None, doc="token for the builtin stack's admin API (prefer admin_token_file or STREAMCHAOS_ADMIN_TOKEN)"),
    Param("admin_token_file", "str", None, doc="file (mode 0600) holding the admin token of a builtin stack started elsewhere"),
    Param("extra_args", "str_list", (), doc="extra command-line arguments for a spawned server"),
    Param("kubernetes", "mapping", None, doc="kind kubernetes: {namespace, service or selector, port, access, kubeconfig, context}"),
))

KUBERNETES_ACCESS = ("auto", "service", "endpoints", "port-forward")

# `port` (a number or a port name) is parsed by the loader itself.
KUBERNETES = Schema((
    Param("namespace", "str", None, doc="the namespace of the target's pods; default the kubeconfig context's, or the runner pod's own"),
    Param("service", "str", None, doc="the Service in front of the pods: its selector finds them, its port is the target's"),
    Param("selector", "mapping", None, doc="pod labels (matchLabels), instead of or besides a Service"),
    Param("access", "choice", "auto", choices=KUBERNETES_ACCESS,
          doc="how the load reaches the pods: the Service's ClusterIP (in the cluster), each ready pod's IP "
              "(endpoints, in the cluster), or port-forward through the API server; auto: service in a pod, else port-forward"),
    Param("kubeconfig", "str", None, doc="kubeconfig file; default $KUBECONFIG, ~/.kube/config, then the pod's service account"),
    Param("context", "str", None, doc="kubeconfig context; default its current-context"),
    Param("path", "str", "/v1", doc="the OpenAI API root on the pods"),
))

PROXY_SERVERS = ("auto", "embedded", "binary", "docker", "external")

PROXY = Schema((
    Param("enabled", "bool", True, doc="false keeps the section but runs without the proxy"),
    Param("server", "choice", "auto", choices=PROXY_SERVERS, doc="which Toxiproxy server to use"),
    Param("url", "str", None, doc="Toxiproxy API URL for server external (TOXIPROXY_URL also counts)"),
    Param("name", "str", "streamchaos", doc="the proxy's name on the Toxiproxy server"),
    Param("listen", "str", "127.0.0.1:0", doc="where the proxy listens; 0.0.0.0:PORT for a Toxiproxy in another pod (clients then use the API URL's host)"),
))

PROMPTS = Schema((
    Param("source", "str", "synthetic", doc="synthetic, or a JSONL file (relative to the experiment) of {prompt} or {messages}"),
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
        Param("ignore_eos", "bool", True, doc="builtin stack: generate exactly max_tokens"),
        Param("include_usage", "bool", True, doc="ask for stream_options.include_usage"),
        Param("request_timeout", "duration", 30.0, doc="client timeout for one request"),
        Param("workers", "int", 1, min=1, max=64, doc="load generator processes"),
        # 20ms, not the 5ms a dedicated load host could hold: on a 2-core machine that also runs the
        # builtin engine, the generator's loop routinely wakes 5-15ms late at light load (measured).
        # A flagged run only turns a timing failure inconclusive when the lag could explain it.
        Param("lag_threshold", "duration", 0.020, doc="generator event-loop lag p99 above this flags the run"),
        Param("prompts", "mapping", None, doc="prompt source and shape"),
    ),
    at_most_one_of=(("concurrency", "rate"),),
)

PHASE = Schema((
    Param("name", "str", required=True, doc="unique phase name"),
    Param("duration", "duration", required=True, doc="how long the phase lasts"),
    Param("faults", "mapping", None, doc="a list of fault entries {kind, name?, ...params}"),
))

SAFETY = Schema((
    Param("max_duration", "duration", 600.0, doc="hard stop for the whole run"),
    Param("drain_timeout", "duration", 10.0, doc="after the last phase: wait for in-flight streams"),
    Param("cleanup_window", "duration", 2.0, doc="then keep scraping metrics this long"),
    Param("allow_gpu_clock_changes", "bool", False, doc="gpu.throttle (nvml) and gpu.power_cap refuse to run without it"),
    Param("scrape_interval", "duration", 0.2, doc="metric scrape period, 100ms to 1s"),
))

# Keys every fault / SLA entry may carry besides its kind's own parameters.
FAULT_ENTRY_KEYS = ("kind", "name")
SLA_ENTRY_KEYS = ("kind", "name", "phases", "expect")
