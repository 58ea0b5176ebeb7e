"""The run's watch of its own Toxiproxy proxy on report.html and in report.json (issue 41 point 1):
beside the proxy's facts, how many times the run read its proxy back and how many reads the server
did not answer; an unguarded server's note shown whole."""

from __future__ import annotations

import re

from chaos.execution.proxy import UNGUARDED
from chaos.model.observations import Note, Observations
from chaos.output.report import environment
from chaos.output.reports.environment import render_environment

API = "http://127.0.0.1:40111"
WATCH = {"every_s": 1.0, "reads": 42, "unanswered": 3, "proxy": "streamchaos", "api_url": API}


def _observed() -> Observations:
    obs = Observations(experiment="watched")
    obs.notes += [
        Note(topic="proxy", t=1, data={"server": "binary", "why": "toxiproxy-server binary /usr/bin/toxiproxy-server",
                                       "api_url": API, "listen": "127.0.0.1:40112", "upstream": "127.0.0.1:40113",
                                       "proxy": "streamchaos", "notes": [UNGUARDED]}),
        Note(topic="proxy_watch", t=2, data=dict(WATCH)),
    ]
    return obs


def _row(page: str, title: str) -> str:
    found = re.findall(rf"<tr><th>{re.escape(title)}</th><td>(.*?)</td></tr></table></td></tr>", page, re.S)
    assert found, page
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", found[0]))


def test_the_proxy_watch_is_in_the_environment_beside_the_proxy() -> None:
    env = environment(_observed())
    assert env["proxy_watch"] == WATCH  # report.json: the note as the run wrote it
    page = render_environment({"environment": env, "path": None, "proxy": None})
    watch = _row(page, "proxy watch (the run reading its proxy back: reads, and reads the server did not answer)")
    assert "reads 42" in watch and "unanswered 3" in watch and API in watch, watch
    titles = re.findall(r"<tr><th>([^<]+)</th>", page)
    assert titles.index("proxy (and why this one)") + 1 == titles.index(
        "proxy watch (the run reading its proxy back: reads, and reads the server did not answer)"), titles
    proxy = _row(page, "proxy (and why this one)")
    assert "UNGUARDED" in proxy and "server: auto runs the embedded, guarded one" in proxy and " …" not in proxy


def test_a_run_without_a_proxy_shows_no_watch() -> None:
    page = render_environment({"environment": environment(Observations()), "path": None, "proxy": None})
    assert "proxy watch" not in page and "went straight to the target" in page
