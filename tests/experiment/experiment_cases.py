"""Named experiment texts: good ones with what they must parse to, bad ones with every problem expected.

Each bad case lists all of its problems in file order as (line, column, key path, message part).
Kinds `test.latency`, `test.hangup` and `test.slo` are registered by this package's conftest.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bad:
    id: str
    text: str
    expected: tuple[tuple[int, int, str, str], ...]


@dataclass(frozen=True)
class Good:
    id: str
    text: str


MINIMAL = Good("minimal", """\
name: minimal
phases:
  - name: only
    duration: 1s
""")

FULL = Good("full", """\
name: full
description: every section given
seed: 42
target:
  kind: openai
  url: http://127.0.0.1:8000/v1
  metrics_url: http://127.0.0.1:8000/metrics
  model: served-model
  startup_timeout: 1.5m
  api_key: secret
  extra_args: [--foo, bar]
proxy:
  server: embedded
  name: sc-proxy
load:
  endpoint: chat
  rate: 600/m
  burstiness: 0.5
  max_requests: 100
  max_tokens: [8, 64]
  temperature: 0.7
  request_timeout: 2500ms
  workers: 2
  lag_threshold: 10ms
  prompts:
    min_chars: 4
    max_chars: 8
    mix: {ascii: 50%, cjk: 0.25, emoji: 25%}
phases:
  - name: baseline
    duration: 250ms
  - name: jitter
    duration: 2s
    faults:
      - kind: test.latency
        latency: 100ms
        jitter: 20ms
        toxicity: 30%
      - kind: test.latency
        latency: 5ms
      - kind: test.hangup
        name: hangups
        after_tokens: [1, 8]
sla:
  - kind: test.slo
    budget: 500ms
  - kind: test.slo
    phases: jitter
    budget: 2s
    expect: fail
  - kind: test.slo
    name: tail
    phases: [baseline, jitter]
    quantile: 0.9
    budget: 1s
safety:
  max_duration: 1m
  drain_timeout: 5s
  cleanup_window: 1s
  allow_gpu_clock_changes: true
  scrape_interval: 100ms
""")

ANCHORS = Good("anchors-and-merge-keys", """\
name: anchors
proxy:
phases:
  - name: a
    duration: 1s
    faults:
      - &slow {kind: test.latency, latency: 50ms}
  - name: b
    duration: 1s
    faults:
      - <<: *slow
        jitter: 10ms
""")

PROXY_OFF = Good("proxy-false", """\
name: p
proxy: false
load: {concurrency: 2}
phases: [{name: x, duration: 1s}]
""")

DOCKER = Good("docker", """\
name: docker
target:
  kind: docker
  image: vllm/vllm-openai:v0.6.3
  command: [--model, /models/llama, --port, "8000"]
  env: {HF_HOME: /cache, VLLM_LOGGING_LEVEL: INFO, MAX_JOBS: 4}
  port: 8000
  volumes: [/srv/models:/models:ro, /srv/cache:/cache]
  gpus: 1
  startup_timeout: 10m
phases:
  - name: freeze
    duration: 2s
    faults: [{kind: docker.pause}, {kind: docker.cpu_limit, cpus: 0.5},
             {kind: docker.kill, signal: SIGTERM, at: 1s, restart: true}]
""")

GOOD_CASES = (MINIMAL, FULL, ANCHORS, PROXY_OFF, DOCKER)


SYNTAX = Bad("yaml-syntax", """\
name: broken
phases: [
  {name: a, duration: 1s
""", ((4, 1, "", "invalid YAML"),))

TAB = Bad("tab-indent", """\
name: x
\tphases: []
""", ((2, 1, "", "invalid YAML: found character '\\t'"),))

NOT_A_MAPPING = Bad("top-level-list", """\
- name: x
- phases: []
""", ((1, 1, "", "the experiment must be a mapping"),))

EMPTY = Bad("empty-document", "# nothing here\n", ((0, 0, "", "found an empty document"),))

DUPLICATE_KEY = Bad("duplicate-key", """\
name: a
phases:
  - name: x
    duration: 1s
name: b
""", ((5, 1, "name", "duplicate key 'name' (first given at line 1)"),))

UNKNOWN_SECTION = Bad("unknown-section", """\
name: x
phases: [{name: a, duration: 1s}]
targt:
  kind: builtin
""", ((3, 1, "targt", "unknown section 'targt' (did you mean 'target'?)"),))

MISSING_REQUIRED = Bad("missing-name-and-phases", """\
description: nothing else
""", ((1, 1, "", "missing required key 'name'"), (1, 1, "", "missing required key 'phases'")))

BARE_DURATION = Bad("duration-without-unit", """\
name: x
phases:
  - name: a
    duration: 4
""", ((4, 15, "phases[0].duration", "expected a duration with a unit such as '250ms'"),))

UNKNOWN_FAULT_KIND = Bad("unknown-fault-kind", """\
name: x
phases:
  - name: a
    duration: 1s
    faults:
      - kind: test.latncy
        latency: 1s
""", ((6, 15, "phases[0].faults[0].kind", "unknown fault kind 'test.latncy' (did you mean 'test.latency'?)"),))

UNKNOWN_FAULT_PARAM = Bad("unknown-fault-param", """\
name: x
proxy: {}
phases:
  - name: a
    duration: 1s
  - name: b
    duration: 1s
    faults:
      - kind: test.latency
        latency: 100ms
        jiter: 10ms
""", ((11, 9, "phases[1].faults[0].jiter", "unknown key 'jiter' (did you mean 'jitter'?)"),))

BAD_FAULT_VALUE = Bad("bad-fault-value", """\
name: x
proxy: {}
phases:
  - name: a
    duration: 1s
    faults:
      - kind: test.latency
        latency: 100ms
        jitter: fast
        toxicity: 130%
""", ((9, 17, "phases[0].faults[0].jitter", "expected a duration such as '250ms', found 'fast'"),
      (10, 19, "phases[0].faults[0].toxicity", "a fraction must lie between 0 and 1")))

ONE_OF = Bad("exactly-one-of", """\
name: x
phases:
  - name: a
    duration: 1s
    faults:
      - kind: test.hangup
        after_tokens: 3
        after: 2s
""", ((6, 9, "phases[0].faults[0]", "give exactly one of after_tokens, after (found: after_tokens, after)"),))

FAULT_CROSS_CHECK = Bad("fault-needs-proxy", """\
name: x
phases:
  - name: a
    duration: 1s
    faults:
      - kind: test.latency
        latency: 100ms
""", ((6, 9, "phases[0].faults[0]", "test.latency acts through the proxy"),))

DUPLICATE_PHASE = Bad("duplicate-phase", """\
name: x
phases:
  - name: a
    duration: 1s
  - name: a
    duration: 2s
""", ((5, 11, "phases[1].name", "duplicate phase name 'a' (also phases[0])"),))

NO_PHASES = Bad("empty-phases", """\
name: x
phases: []
""", ((2, 9, "phases", "expected a non-empty list of phases"),))

SLA_UNKNOWN_PHASE = Bad("sla-unknown-phase", """\
name: x
phases:
  - name: storm
    duration: 1s
sla:
  - kind: test.slo
    budget: 1s
    phases: [strom]
""", ((8, 14, "sla[0].phases[0]", "unknown phase 'strom' (did you mean 'storm'?); phases: storm"),))

SLA_BAD_ENTRY = Bad("sla-kind-budget-expect", """\
name: x
phases: [{name: a, duration: 1s}]
sla:
  - kind: test.sol
    budget: 1s
  - kind: test.slo
    expect: maybe
  - kind: test.slo
    budget: 1
""", ((4, 11, "sla[0].kind", "unknown SLA kind 'test.sol' (did you mean 'test.slo'?)"),
      (6, 5, "sla[1]", "missing required key 'budget'"),
      (7, 13, "sla[1].expect", "expected pass or fail, found 'maybe'"),
      (9, 13, "sla[2].budget", "expected a duration with a unit")))

LOAD_BOTH = Bad("concurrency-and-rate", """\
name: x
load:
  concurrency: 4
  rate: 20/s
phases: [{name: a, duration: 1s}]
""", ((3, 3, "load", "give at most one of concurrency, rate (found: concurrency, rate)"),))

PROMPTS = Bad("prompt-shape", """\
name: x
load:
  prompts:
    min_chars: 64
    max_chars: 32
    mix: {ascii: 50%, cjk: 20%}
phases: [{name: a, duration: 1s}]
""", ((4, 16, "load.prompts.min_chars", "min_chars (64) must not exceed max_chars (32)"),
      (6, 10, "load.prompts.mix", "the fractions must sum to 1 (100%), found 0.7")))

SAFETY = Bad("safety-bounds", """\
name: x
phases: [{name: a, duration: 90s}]
safety:
  scrape_interval: 50ms
  max_duration: 1m
""", ((4, 20, "safety.scrape_interval", "must lie between 100ms and 1s, found 50ms"),
      (5, 17, "safety.max_duration", "the run needs 103s (phases 90s + drain_timeout 10s + cleanup_window 2s "
       "+ 1s baseline), more than max_duration 60s")))

TARGET = Bad("target-kind-and-url", """\
name: x
target:
  kind: opneai
  url: localhost:8000
phases: [{name: a, duration: 1s}]
""", ((3, 9, "target.kind",
       "expected one of builtin, openai, vllm, docker, kubernetes, found 'opneai' (did you mean 'openai'?)"),
      (4, 8, "target.url", "expected an http(s) URL")))

DOCKER_ONLY_KEYS = Bad("docker-keys-on-another-kind", """\
name: x
target:
  kind: openai
  url: http://127.0.0.1:8000/v1
  image: vllm/vllm-openai
  gpus: all
phases: [{name: a, duration: 1s}]
""", ((5, 10, "target.image",
       "only a docker target takes 'image' (target.kind is openai); set kind: docker, or remove it"),
      (6, 9, "target.gpus", "only a docker target takes 'gpus' (target.kind is openai)")))

DOCKER_TARGET = Bad("docker-target", """\
name: x
target:
  kind: docker
  url: http://127.0.0.1:8000/v1
  command: [serve]
  network: hots
  port: 70000
  env: {HF_TOKEN: abc, 2BAD: x, NESTED: {a: 1}}
  volumes: [/models:/models:ro, models:/models, /a:/b:rx]
  gpus: device=
phases: [{name: a, duration: 1s}]
""", ((4, 8, "target.url", "a docker target is reached where its container listens (network, port); remove url"),
      (5, 12, "target.command", "command needs an image; without one the builtin stack runs"),
      (6, 12, "target.network", "expected one of bridge, host, found 'hots' (did you mean 'host'?)"),
      (7, 9, "target.port", "must be at most 65535, found 70000"),
      (8, 24, "target.env.2BAD", "expected an environment variable name (letters, digits, _), found '2BAD'"),
      (8, 41, "target.env.NESTED", "expected a string or a number, found dict"),
      (9, 33, "target.volumes[1]", "both paths must be absolute (/...), found 'models:/models'"),
      (9, 49, "target.volumes[2]", "the mode must be ro or rw, found 'rx' in '/a:/b:rx'"),
      (10, 9, "target.gpus", "expected all, a count such as 2, or device=0,1, found 'device='")))

DUPLICATE_FAULT_NAME = Bad("duplicate-fault-name", """\
name: x
phases:
  - name: a
    duration: 1s
    faults: [{kind: test.hangup, name: h, after: 1s}]
  - name: b
    duration: 1s
    faults: [{kind: test.hangup, name: h, after: 2s}]
""", ((8, 40, "phases[1].faults[0].name", "duplicate fault name 'h' (also phases[0].faults[0])"),))

MANY = Bad("several-mistakes-in-file-order", """\
name: many
seed: seven
load:
  concurrency: 0
  max_tokens: [9, 3]
phases:
  - name: a
    duration: 1 sec
    faults:
      - kind: test.hangup
        after: soon
  - duration: 1s
sla:
  - kind: test.slo
    budget: 1s
    phases: [b]
safety:
  scrape_interval: 2s
""", (
    (2, 7, "seed", "expected an integer, found 'seven'"),
    (4, 16, "load.concurrency", "must be at least 1, found 0"),
    (5, 15, "load.max_tokens", "expected an integer or a range [low, high] with low <= high"),
    (8, 15, "phases[0].duration", "unknown duration unit 'sec'"),
    (11, 16, "phases[0].faults[0].after", "expected a duration such as '250ms', found 'soon'"),
    (12, 5, "phases[1]", "missing required key 'name'"),
    (16, 14, "sla[0].phases[0]", "unknown phase 'b'"),
    (18, 20, "safety.scrape_interval", "must lie between 100ms and 1s, found 2s"),
))

ALLOWED_TARGETS = Bad("allowed-targets", """\
name: x
phases: [{name: a, duration: 1s}]
safety:
  allowed_targets:
    hosts: [vllm, 10.0.0.0/33, "bad host", "http://gw:99999/v1"]
    namespaces: [staging, Bad_NS]
    selectors: ["app=vllm", "tier in (a,b", ""]
    hostz: [x]
""", (
    (5, 19, "safety.allowed_targets.hosts[1]", "'10.0.0.0/33' is not a CIDR such as 10.0.0.0/8"),
    (5, 32, "safety.allowed_targets.hosts[2]", "'bad host': not a host name, IP, CIDR, host:port or URL"),
    (5, 44, "safety.allowed_targets.hosts[3]", "the port is not a number"),
    (6, 27, "safety.allowed_targets.namespaces[1]", "'Bad_NS' is not a namespace name"),
    (7, 29, "safety.allowed_targets.selectors[1]", "cannot read 'tier in (a,b'"),
    (7, 45, "safety.allowed_targets.selectors[2]", "an empty selector selects every pod"),
    (8, 5, "safety.allowed_targets.hostz", "unknown key 'hostz' (did you mean 'hosts'?)"),
))

LOAD_SHARDS = Bad("load-shards", """\
name: x
load:
  workers: 2
  shards: 3
  shard_launch: external
  shard_listen: 0.0.0.0:0
  shard_connect_timeout: 0s
phases: [{name: a, duration: 1s}]
""", (
    (3, 12, "load.workers", "give load.workers or load.shards, not both"),
    (6, 17, "load.shard_listen", "external shards must be told where to connect: give a fixed port"),
    (7, 26, "load.shard_connect_timeout", "must be greater than zero"),
))

LOAD_SHARD_LISTEN = Bad("load-shard-listen", """\
name: x
load: {shards: 1, shard_launch: external, shard_listen: "nope"}
phases: [{name: a, duration: 1s}]
""", (
    (2, 33, "load.shard_launch", "external shards need load.shards of 2 or more"),
    (2, 57, "load.shard_listen", "expected host:port such as 127.0.0.1:0 or 0.0.0.0:7070"),
))

BAD_CASES = (
    ALLOWED_TARGETS, LOAD_SHARDS, LOAD_SHARD_LISTEN, SYNTAX, TAB, NOT_A_MAPPING, EMPTY, DUPLICATE_KEY,
    UNKNOWN_SECTION, MISSING_REQUIRED, BARE_DURATION,
    UNKNOWN_FAULT_KIND, UNKNOWN_FAULT_PARAM, BAD_FAULT_VALUE, ONE_OF, FAULT_CROSS_CHECK, DUPLICATE_PHASE,
    NO_PHASES, SLA_UNKNOWN_PHASE, SLA_BAD_ENTRY, LOAD_BOTH, PROMPTS, SAFETY, TARGET, DOCKER_ONLY_KEYS, DOCKER_TARGET,
    DUPLICATE_FAULT_NAME, MANY,
)
