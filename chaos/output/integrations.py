"""The tools streamchaos plugs into, in one table: `streamchaos list integrations` prints it and
docs/support.md carries it (scripts/update_readme.py). Each row names how it is used, its page, and
what the tests run it against — a real component, or, where none can be installed here, what stands
in for it. Pure data and its rendering."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["INTEGRATIONS", "Integration", "integrations_markdown", "integrations_text"]


@dataclass(frozen=True)
class Integration:
    name: str
    what: str  # what it does for an SRE
    how: str  # the key, flag, command or file that turns it on
    page: str  # docs/<page>
    tested_against: str  # what the tests run it against


INTEGRATIONS: tuple[Integration, ...] = (
    Integration("Prometheus", "a PromQL expression (krkn alert-profile shape) halts the run, fails it or is recorded",
                "safety.stop_when: [{source: prometheus, ...}]", "fleet-signals.md",
                "Prometheus 2.42 (Debian) scraping the builtin stack, behind an nginx bearer-token proxy"),
    Integration("Alertmanager", "a matching active alert halts the run and refuses to start it",
                "safety.stop_when: [{source: alertmanager, ...}]", "fleet-signals.md",
                "Alertmanager 0.25 (Debian), fed by that Prometheus's alert rules"),
    Integration("Fleet lever", "a host file or Kubernetes ConfigMap that refuses new runs and halts running ones",
                "streamchaos lever on|off|status; safety.lever", "lever.md",
                "the host file; the ConfigMap on the tests' fake API server (as a real 1.36 cluster answers)"),
    Integration("Prometheus exposition", "the run's QoS series, served or pushed while it runs",
                "streamchaos run --metrics-port / --push-metrics", "reports.md",
                "prometheus-client's own parser on the run's endpoint; a local server standing in for the Pushgateway"),
    Integration("llm-d Benchmark Report", "one report per phase, schema v0.2.1", "streamchaos report RUN --as llm-d",
                "result-formats.md", "the published JSON Schema (llm-d-benchmark)"),
    Integration("AIPerf export", "profile_export_aiperf.json (export schema 1.0)", "streamchaos report RUN --as aiperf",
                "result-formats.md", "a JSON Schema translated from AIPerf's export models"),
    Integration("vLLM bench serve", "the run's figures under vllm bench serve's names",
                "streamchaos report RUN --as vllm-bench", "result-formats.md", "vLLM's own field names"),
    Integration("OpenTelemetry", "GenAI semantic-convention metrics and one span per stream under phase and fault "
                "spans, over OTLP/HTTP; traceparent sent to the target",
                "streamchaos run --otlp (OTEL_EXPORTER_OTLP_*)",
                "opentelemetry.md", "a receiver process decoding the payloads with opentelemetry-proto; the target's "
                "traceparent read from a stream hop's taps"),
    Integration("Chaos Toolkit", "the chaosstreamchaos extension: actions run an experiment or start load and one "
                "fault, probes judge one SLA (inconclusive fails the tolerance) or KV back to baseline",
                "pip install ./integrations/chaostoolkit", "chaostoolkit.md",
                "chaostoolkit 1.19's own `chaos run`, on a healthy stack and one with a planted KV leak"),
    Integration("Grafana annotations", "one region per phase and per fault window, a point for a halt",
                "streamchaos run|report --grafana URL", "grafana.md",
                "a receiver implementing Grafana's legacy /api/annotations (no Grafana can be installed here)"),
    Integration("GitHub Actions", "a composite action: the run, its verdict table in the job summary, one "
                "annotation per failed SLA", "uses: <owner>/streamchaos@main (action.yml)", "github-action.md",
                "the action's steps run locally as the runner runs them, on a real run"),
)


def integrations_text() -> str:
    """`streamchaos list integrations`: one block per integration."""
    lines = ["Integrations (docs/support.md#integrations):", ""]
    for i in INTEGRATIONS:
        lines += [f"  {i.name}", f"    {i.what}", f"    use: {i.how}", f"    docs: docs/{i.page}",
                  f"    tested against: {i.tested_against}", ""]
    return "\n".join(lines).rstrip() + "\n"


def integrations_markdown() -> str:
    """docs/support.md's integrations table."""
    rows = ["| integration | what it does | how | tested against |", "| --- | --- | --- | --- |"]
    for i in INTEGRATIONS:
        rows.append(f"| [{i.name}]({i.page}) | {_cell(i.what)} | `{_cell(i.how)}` | {_cell(i.tested_against)} |")
    return "\n".join(rows)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")
