"""HTML pieces every view uses: escaping, a page shell, and evidence rendered generically. Pure.

Evidence is whatever a verifier put in its ``Verdict.evidence``; new keys (``n_eff``, a new
verifier's counts) show up without a change here. Keys say their unit where it matters (``*_s``
seconds, ``*_ms`` milliseconds, ``*_bytes``), and figures are written with it (``chaos.output.render``).
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from chaos.output.render import format_value

_FIGURE_KEY = re.compile(r"lower|upper|figure|p\d+(\.\d+)?")
# The summary figures of a mapping whose own key names a time unit (``added_latency_ms: {p50, max, ...}``):
# they are in that unit whatever the verdict's is. ``kv_table`` hands the unit down as ``_KEY_UNITS``' key.
_STAT_KEY = re.compile(r"min|max|mean|median|p\d+(\.\d+)?")
_KEY_UNITS = {"_ms": 1e-3, "_s": 1.0}  # a key's suffix → seconds per one of its unit

__all__ = ["CSS", "esc", "evidence_value", "kv_table", "page", "plot_figure", "section"]

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5em auto;max-width:1180px;\
color:#1f2328;padding:0 1em}
h1{margin-bottom:.2em}h2{border-bottom:1px solid #d0d7de;padding-bottom:.2em;margin-top:1.6em}h3{margin:1em 0 .3em}
table{border-collapse:collapse;font-size:13px}td,th{padding:3px 8px;border-bottom:1px solid #d0d7de;text-align:left;\
vertical-align:top}
th{background:#f6f8fa}.num{text-align:right;font-variant-numeric:tabular-nums}
.pass{color:#1a7f37}.fail{color:#cf222e}.inconclusive{color:#9a6700}.muted{color:#57606a}.flag{color:#cf222e;font-weight:600}
.unobservable{color:#57606a}.badge.unobservable{background:#eaeef2;border:1px solid #afb8c1;border-radius:8px;\
padding:0 6px;font-size:12px;color:#424a53}
.unobservable-block{border-left:3px solid #afb8c1;padding:.2em .8em;margin:.6em 0}
.cell-pass{background:#dafbe1}.cell-fail{background:#ffebe9}.cell-inconclusive{background:#fff8c5}\
.cell-unobservable{background:#eaeef2}.cell-none{background:#f6f8fa}
figure.plot{margin:.6em 0 1.2em}figure.plot figcaption{font-size:12px;color:#57606a;max-width:900px}
svg.chart{width:100%;height:auto}details summary{cursor:pointer;color:#0969da}
table.kv{margin:.2em 0}table.kv td:first-child{color:#57606a;white-space:nowrap}code,pre{font-size:12px}
.summary{font-size:14px}.fault-steps{display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));\
gap:.5em 1.5em}
.fault-steps h4{margin:.3em 0;font-size:13px}.grid{display:grid;\
grid-template-columns:repeat(auto-fit,minmax(520px,1fr));gap:0 1.5em}
"""


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def evidence_value(key: str, value: Any, unit: str = "") -> str:
    """One evidence value as text: with its unit when the key names one (``*_s``, ``*_ms``, ``*_bytes``)
    or is a figure in the verdict's own unit (``lower``, ``upper``, ``p99`` ...), else as it is."""
    if isinstance(value, bool) or value is None:
        return "-" if value is None else str(value).lower()
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            return "-"
        if key.endswith("_s"):
            return format_value(float(value), "s")
        if key.endswith("_ms"):
            return format_value(float(value) / 1000.0, "s")
        if key.endswith("_bytes"):
            return f"{value:,.0f} B"
        if unit in _KEY_UNITS:  # under a key that named the unit: its summary figures are in it
            if _STAT_KEY.fullmatch(key):
                return format_value(float(value) * _KEY_UNITS[unit], "s")
        elif unit and _FIGURE_KEY.fullmatch(key):
            return format_value(float(value), unit)
        return f"{value:,}" if isinstance(value, int) else f"{value:.6g}"
    return str(value)


def _key_unit(key: str) -> str | None:
    """The time unit a key names for the figures of the mapping under it (``added_latency_ms``: ``_ms``)."""
    return next((suffix for suffix in _KEY_UNITS if key.endswith(suffix)), None)


def kv_table(data: Mapping[str, Any], *, unit: str = "", depth: int = 0, skip: Iterable[str] = ()) -> str:
    """A key/value table; nested mappings as nested tables, lists as compact JSON (cut long)."""
    skipped = set(skip)
    rows = []
    for key, value in data.items():
        if key in skipped:
            continue
        if isinstance(value, Mapping) and value and depth < 2:
            cell = kv_table(value, unit=_key_unit(str(key)) or unit, depth=depth + 1)
        elif isinstance(value, (list, tuple, Mapping)):
            text = json.dumps(value, default=str, ensure_ascii=False)
            cell = f"<code>{esc(text if len(text) <= 400 else text[:400] + ' …')}</code>"
        else:
            cell = esc(evidence_value(str(key), value, unit))
        rows.append(f"<tr><td>{esc(key)}</td><td>{cell}</td></tr>")
    return f'<table class="kv">{"".join(rows)}</table>' if rows else '<span class="muted">none</span>'


def plot_figure(name: str, svg: str, caption: str, points: int) -> str:
    """One plot on the page: ``data-plot`` names it, ``data-points`` says how many data points it draws."""
    return (f'<figure class="plot" data-plot="{esc(name)}" data-points="{points}">{svg}'
            f"<figcaption>{caption}</figcaption></figure>")


def section(ident: str, title: str, body: str) -> str:
    return f'<section id="{esc(ident)}"><h2>{esc(title)}</h2>\n{body}\n</section>'


def page(title: str, body: str) -> str:
    """A whole self-contained document: inline CSS, no script, no external reference."""
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f"<title>{esc(title)}</title><style>{CSS}</style></head>\n<body>\n{body}\n</body></html>\n")
