"""`load.headers`: over the OpenAI Python SDK's request headers; a bad entry is located where it stands."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from chaos.experiment import parse_experiment
from chaos.load.sdk_headers import request_headers
from chaos.load.wire import settings_from_json
from chaos.load.workload import LoadSettings
from chaos.model.errors import ExperimentInvalid

pytestmark = pytest.mark.timeout(30)

HEAD = "name: h\nphases: [{name: a, duration: 1s}]\nload:\n  headers:\n"


def test_headers_replace_by_name_and_null_drops_one() -> None:
    exp = parse_experiment(HEAD + "    accept-encoding: identity\n    X-Stainless-Lang: null\n    X-Team: chaos\n",
                           "h.yaml")
    assert exp.load.headers == (("accept-encoding", "identity"), ("X-Stainless-Lang", None), ("X-Team", "chaos"))
    sent = request_headers(LoadSettings.of(exp.load).headers, exp.load.request_timeout)
    assert sent["accept-encoding"] == "identity" and "Accept-Encoding" not in sent
    assert "X-Stainless-Lang" not in sent and sent["X-Team"] == "chaos"
    assert sent["User-Agent"].startswith("OpenAI/Python ") and sent["X-Stainless-Read-Timeout"] == "30"


def test_without_headers_the_sdks_are_sent() -> None:
    exp = parse_experiment("name: h\nphases: [{name: a, duration: 1s}]\n", "h.yaml")
    sent = request_headers(exp.load.headers, exp.load.request_timeout)
    assert sent["Accept-Encoding"] == "gzip, deflate" and sent["Accept"] == "application/json"


@pytest.mark.parametrize(("entry", "column", "fragment"), [
    ("    Accept-Encoding: br, gzip\n", 22, "announces 'br', which the load client cannot decode"),
    ("    Accept-Encoding: '*'\n", 22, "announces '*'"),
    ("    Accept-Encoding: 'gzip;q=x'\n", 22, "is not a weight"),
    ('    "X Bad": v\n', 5, "is not a header name"),
    ("    Host: elsewhere\n", 11, "set by the load client itself"),
    ("    X-Retries: 3\n", 16, "as a string (quote it)"),
    ('    X-Split: "a\\r\\nb"\n', 14, "must not contain CR, LF or NUL"),
])
def test_a_bad_header_is_located(entry: str, column: int, fragment: str) -> None:
    with pytest.raises(ExperimentInvalid) as info:
        parse_experiment(HEAD + entry, "h.yaml")
    (problem,) = info.value.problems
    assert (problem.file, problem.line, problem.column) == ("h.yaml", 5, column), problem
    assert problem.path.startswith("load.headers.") and fragment in problem.message, problem


def test_refused_codings_may_be_listed() -> None:
    exp = parse_experiment(HEAD + "    Accept-Encoding: 'gzip, br;q=0'\n", "h.yaml")
    assert exp.load.headers == (("Accept-Encoding", "gzip, br;q=0"),)


def test_a_header_given_twice_is_located() -> None:
    with pytest.raises(ExperimentInvalid) as info:
        parse_experiment(HEAD + "    X-A: one\n    x-a: two\n", "h.yaml")
    (problem,) = info.value.problems
    assert problem.line == 6 and "given twice" in problem.message


def test_headers_travel_to_shards_and_back() -> None:
    settings = LoadSettings(headers=(("Accept-Encoding", "identity"), ("X-A", None)))
    assert settings_from_json(json.loads(json.dumps(asdict(settings)))) == settings
