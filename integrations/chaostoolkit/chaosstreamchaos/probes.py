"""Probes: a run's verdicts from its ``report.json``, and the target's KV cache from its metrics.

For a steady-state hypothesis: ``sla_passed`` and ``run_passed`` with ``"tolerance": true``, or
``sla_verdict`` with ``"tolerance": ["pass"]`` (the Chaos Toolkit compares a list tolerance with the
``status`` of a mapping). Only ``pass`` is within tolerance: an ``inconclusive`` verdict (the run could
not decide) fails it, as do ``fail``, ``unobservable`` and a verdict or report that is missing.
"""

# No `from __future__ import annotations`: see chaosstreamchaos.actions.
import logging
import math
import time
from typing import Any, Dict, List, Optional

import httpx
from chaoslib.exceptions import ActivityFailed
from prometheus_client.parser import text_string_to_metric_families

from chaosstreamchaos import _runs

__all__ = ["kv_back_to_baseline", "run_passed", "sla_passed", "sla_verdict"]

logger = logging.getLogger("chaostoolkit")

# the worst first: of several verdicts that match (one per phase, or two entries of one kind), the probe
# reports the worst
_RANK = {"fail": 0, "inconclusive": 1, "unobservable": 2, "pass": 3}


def sla_verdict(run_dir: str, sla: str, phase: Optional[str] = None) -> Dict[str, Any]:
    """The verdict of one SLA entry of a finished run, from its ``report.json``.

    :param run_dir: the run directory (``run_experiment``'s ``out_dir``, or what an action returned)
    :param sla: the SLA entry's ``name``, or its ``kind`` (``ttft``, ``kv_cleanup``, ...)
    :param phase: only the verdict for this phase (an entry judged per phase has one verdict each);
        without it, of several verdicts that match, the worst: ``fail``, ``inconclusive``, ``unobservable``,
        then ``pass``
    :returns: ``{sla, name, phase, status, figure, budget, unit, samples, expect, ok}`` (and ``reason``
        where the verifier gave one: why it could not decide, say); ``status`` is ``pass``, ``fail``,
        ``inconclusive`` or ``unobservable``, and ``figure`` and ``budget`` are in ``unit``
    :raises ActivityFailed: the run has no readable ``report.json``, or no verdict matches (the message
        lists those there are)
    """
    report = _runs.read_report(run_dir)
    if report is None:
        raise ActivityFailed(f"{run_dir}: no report.json (the run has not ended, or never ran)")
    verdicts = [v for v in report.get("verdicts") or [] if isinstance(v, dict)]
    matching = [v for v in verdicts if v.get("name") == sla] or [v for v in verdicts if v.get("sla") == sla]
    if phase is not None:
        matching = [v for v in matching if v.get("phase") == phase]
    if not matching:
        there = sorted({f"{v.get('name')} ({v.get('sla')}, phase {v.get('phase') or 'run'})" for v in verdicts})
        where = f" in phase {phase}" if phase is not None else ""
        raise ActivityFailed(f"{run_dir}: no verdict for SLA {sla!r}{where}; the run has: {', '.join(there) or 'none'}")
    worst = min(matching, key=lambda v: _RANK.get(str(v.get("status")), -1))
    return {**_runs.verdict_summary(worst), "run_dir": str(run_dir)}


def sla_passed(run_dir: str, sla: str, phase: Optional[str] = None) -> bool:
    """True only when the SLA entry's verdict is ``pass`` (every one of them, without ``phase``).

    ``inconclusive`` is False: a run that could not decide has not shown the SLA holds. So are ``fail``,
    ``unobservable`` (even where the experiment tolerates it for its exit code) and a verdict, report or
    run directory that is missing.

    :param run_dir: the run directory
    :param sla: the SLA entry's ``name``, or its ``kind``
    :param phase: only the verdict for this phase
    """
    try:
        return bool(sla_verdict(run_dir, sla, phase)["status"] == "pass")
    except ActivityFailed as exc:
        logger.warning("sla_passed: %s", exc)
        return False


def run_passed(run_dir: str) -> bool:
    """True only when the run ended with exit code 0 (every SLA as expected); 1, 3 (inconclusive), 2, 4,
    and a run without a ``report.json``, are False.

    :param run_dir: the run directory
    """
    report = _runs.read_report(run_dir)
    return report is not None and report.get("exit_code") == 0


def kv_back_to_baseline(metrics_url: str, baseline: float = 0.0, within_s: float = 10.0,
                        series: str = "vllm:kv_cache_usage_perc", tolerance: float = 0.01) -> bool:
    """Whether the target's KV-cache usage is back to ``baseline``, scraping its Prometheus metrics until it
    is or ``within_s`` has passed (at least once).

    Every sample of ``series`` (one per engine or label set) must be within ``tolerance`` of ``baseline``.
    False when it is not by then, and also when the series is absent from every scrape or the endpoint
    did not answer: a metric that cannot be read does not show the cache came back. The builtin stack
    and vLLM export ``vllm:kv_cache_usage_perc`` (a fraction, 0 to 1).

    :param metrics_url: the Prometheus endpoint, e.g. ``http://127.0.0.1:8000/metrics``
    :param baseline: the usage at rest (0.0: nothing held)
    :param within_s: how long to keep scraping
    :param series: the sample name to read
    :param tolerance: how far from ``baseline`` still counts as back
    """
    deadline = time.monotonic() + within_s
    last: Optional[List[float]] = None
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        while True:
            values = _scrape(client, metrics_url, series)
            if values:
                last = values
                if all(abs(v - baseline) <= tolerance for v in values):
                    return True
            if time.monotonic() + 0.25 > deadline:
                break
            time.sleep(0.25)
    logger.warning("kv_back_to_baseline: %s %s after %gs (baseline %g, tolerance %g)", series,
                   f"at {last}" if last else f"absent from {metrics_url}", within_s, baseline, tolerance)
    return False


def _scrape(client: httpx.Client, url: str, series: str) -> List[float]:
    """The values of every sample named ``series`` at ``url``; [] when there are none or it cannot be read."""
    try:
        response = client.get(url)
        response.raise_for_status()
        families = list(text_string_to_metric_families(response.text))
    except (httpx.HTTPError, ValueError) as exc:
        logger.debug("kv_back_to_baseline: %s: %s", url, exc)
        return []
    return [float(s.value) for family in families for s in family.samples
            if s.name == series and not math.isnan(float(s.value))]
