"""``path:``: the hops between load and target, each located when wrong; the old ``proxy:`` as a path of
one toxiproxy hop (with its note); the dry run's account of a path; the taps file read, bounded."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from chaos.execution.dryrun import dry_run
from chaos.execution.path import MAX_TAP_RECORDS, read_taps, start_allowance_s
from chaos.execution.runner import save_experiment
from chaos.experiment import experiment_from_dict, load_experiment, parse_experiment
from chaos.model.errors import ExperimentInvalid, Problem
from chaos.model.experiment import HopSpec, ProxySpec
from chaos.model.observations import TapRecord, to_json

pytestmark = pytest.mark.timeout(30)

HEAD = "name: hops\nphases:\n  - {name: only, duration: 1s}\n"


def _problems(text: str, filename: str = "exp.yaml") -> list[Problem]:
    with pytest.raises(ExperimentInvalid) as info:
        parse_experiment(text, filename)
    return list(info.value.problems)


def test_a_path_is_its_hops_load_side_first_named_by_kind_where_not_named() -> None:
    exp = parse_experiment(HEAD + "path:\n  - {kind: stream, name: outer}\n  - {kind: nginx, read_timeout: 5s}\n"
                           "  - {kind: stream, tap: false}\n  - {kind: stream}\n")
    assert [(h.kind, h.name) for h in exp.path] == [("stream", "outer"), ("nginx", "nginx"), ("stream", "stream"),
                                                    ("stream", "stream-2")]
    assert exp.path[0].tap and not exp.path[2].tap
    assert exp.path[1].option("read_timeout") == 5.0  # parsed by nginx's own schema, in seconds
    assert exp.hop("outer") is exp.path[0] and exp.hop("nowhere") is None
    assert not exp.proxy.enabled  # no toxiproxy in this path: the network faults would be refused


def test_a_toxiproxy_hop_is_the_runs_proxy() -> None:
    exp = parse_experiment(HEAD + "path:\n  - {kind: stream}\n  - {kind: toxiproxy, server: embedded}\n")
    assert exp.proxy == ProxySpec(enabled=True, server="embedded")  # the proxy's own name stays the old default
    assert exp.path[1] == HopSpec(kind="toxiproxy", name="toxiproxy", proxy=exp.proxy)
    named = parse_experiment(HEAD + "path: [{kind: toxiproxy, name: lossy, listen: '127.0.0.1:0'}]\n")
    assert named.proxy.name == "lossy" and named.path[0].name == "lossy"


def test_the_old_proxy_section_is_a_path_of_one_toxiproxy_hop_noted_once(
        capsys: pytest.CaptureFixture[str]) -> None:
    text = HEAD + "proxy:\n  server: embedded\n  name: sc-proxy\n"
    exp = parse_experiment(text, "old-proxy.yaml")
    assert exp.proxy == ProxySpec(enabled=True, server="embedded", name="sc-proxy")
    assert exp.path == (HopSpec(kind="toxiproxy", name="toxiproxy", proxy=exp.proxy),)
    err = capsys.readouterr().err
    assert err == ("old-proxy.yaml:4: note: `proxy:` is deprecated: write path: [{kind: toxiproxy, name: sc-proxy, "
                   "server: embedded}] instead\n")
    parse_experiment(text, "old-proxy.yaml")
    assert capsys.readouterr().err == ""  # once per file and line
    off = parse_experiment(HEAD + "proxy: {enabled: false}\n", "off.yaml")
    assert off.path == () and not off.proxy.enabled
    assert "off.yaml:4: note: `proxy:` is deprecated: remove it" in capsys.readouterr().err


def test_a_hop_kind_that_does_not_exist_names_every_kind() -> None:
    (problem,) = _problems(HEAD + "path:\n  - {kind: stream}\n  - {kind: ngnix}\n")
    assert (problem.line, problem.column, problem.path) == (6, 12, "path[1].kind")
    assert "unknown hop kind 'ngnix' (did you mean 'nginx'?)" in problem.message
    for kind in ("caddy", "haproxy", "litellm", "nginx", "stream", "toxiproxy", "url"):
        assert kind in problem.message.split("known kinds:")[1]


def test_duplicate_names_and_names_no_file_can_carry_are_located() -> None:
    dup, bad = _problems(HEAD + "path:\n  - {kind: stream, name: edge}\n  - {kind: nginx, name: edge}\n"
                         "  - {kind: stream, name: ../up}\n")
    assert (dup.line, dup.path) == (6, "path[1].name") and "duplicate hop name 'edge' (also path[0])" in dup.message
    assert (bad.line, bad.path) == (7, "path[2].name") and "found '../up'" in bad.message


def test_an_option_the_gateway_does_not_have_is_located_with_a_suggestion() -> None:
    (problem,) = _problems(HEAD + "path:\n  - kind: nginx\n    read_timout: 5s\n")
    assert (problem.line, problem.column, problem.path) == (6, 5, "path[0].read_timout")
    assert "nginx has no option 'read_timout' (did you mean 'read_timeout'?)" in problem.message
    (wrong,) = _problems(HEAD + "path: [{kind: stream, read_timeout: 5s}]\n")  # a stream hop has no such knob
    assert wrong.path == "path[0].read_timeout" and "unknown key 'read_timeout'" in wrong.message


def test_a_gateway_config_is_a_file_beside_the_experiment(tmp_path: Path) -> None:
    (tmp_path / "nginx.conf").write_text("# listen {{listen}}\n", encoding="utf-8")
    exp_file = tmp_path / "exp.yaml"
    exp_file.write_text(HEAD + "path: [{kind: nginx, config: nginx.conf}]\n", encoding="utf-8")
    assert load_experiment(exp_file).path[0].config == str(tmp_path / "nginx.conf")
    exp_file.write_text(HEAD + "path: [{kind: haproxy, config: missing.cfg}]\n", encoding="utf-8")
    with pytest.raises(ExperimentInvalid) as info:
        load_experiment(exp_file)
    (problem,) = info.value.problems
    assert (problem.file, problem.line, problem.path) == (str(exp_file), 4, "path[0].config")
    assert "haproxy configuration file 'missing.cfg' not found" in problem.message
    both = _problems(HEAD + f"path: [{{kind: nginx, config: '{tmp_path / 'nginx.conf'}', gzip: true}}]\n")
    assert [p.path for p in both] == ["path[0].gzip"] and "would be ignored" in both[0].message


def test_a_config_that_cannot_say_where_to_listen_is_refused_where_it_is_named(tmp_path: Path) -> None:
    (tmp_path / "fixed.conf").write_text("listen 127.0.0.1:8080;\nproxy_pass {{upstrem}};\n", encoding="utf-8")
    exp_file = tmp_path / "exp.yaml"
    exp_file.write_text(HEAD + "path:\n  - {kind: stream}\n  - {kind: nginx, config: fixed.conf}\n",
                        encoding="utf-8")
    with pytest.raises(ExperimentInvalid) as info:
        load_experiment(exp_file)
    unknown, no_listen = info.value.problems
    assert (unknown.line, unknown.column, unknown.path) == (6, 27, "path[1].config")
    assert f"{tmp_path / 'fixed.conf'}:2:12: unknown placeholder {{{{upstrem}}}}" in unknown.message
    assert "did you mean 'upstream'" in unknown.message
    assert "neither {{listen}} nor {{port}}" in no_listen.message


def test_one_toxiproxy_at_most_and_not_beside_the_old_proxy_section() -> None:
    (second,) = _problems(HEAD + "path:\n  - {kind: toxiproxy}\n  - {kind: toxiproxy, name: two}\n")
    assert second.path == "path[1].kind" and "a second toxiproxy hop (the first is path[0])" in second.message
    (both,) = _problems(HEAD + "proxy: {server: embedded}\npath: [{kind: toxiproxy}]\n")
    assert (both.line, both.column, both.path) == (4, 1, "proxy")
    assert "path: carries one too (path[0])" in both.message
    (beside,) = _problems(HEAD + "proxy: true\npath: [{kind: stream}]\n")
    assert beside.path == "proxy" and "write the toxiproxy as a hop of path:" in beside.message


def test_a_url_hop_is_a_url_and_the_last_hop() -> None:
    exp = parse_experiment(HEAD + "path: [{kind: stream}, {kind: url, url: 'http://127.0.0.1:8080/v1/'}]\n")
    assert exp.path[1] == HopSpec(kind="url", name="url", url="http://127.0.0.1:8080/v1")
    (first,) = _problems(HEAD + "path: [{kind: url, url: 'http://127.0.0.1:1/v1'}, {kind: stream}]\n")
    assert first.path == "path[0].kind" and "make it the last hop" in first.message
    (bad,) = _problems(HEAD + "path: [{kind: url, url: nowhere}]\n")
    assert bad.path == "path[0].url" and "found 'nowhere'" in bad.message
    (missing,) = _problems(HEAD + "path: [{kind: url}]\n")
    assert missing.path == "path[0]" and "missing required key 'url'" in missing.message


def test_a_path_that_is_not_a_list_names_the_kinds() -> None:
    (problem,) = _problems(HEAD + "path: {kind: stream}\n")
    assert problem.path == "path" and "expected a list of hops" in problem.message and "litellm" in problem.message


def test_a_dict_built_experiment_takes_a_path_too() -> None:
    exp = experiment_from_dict({"name": "d", "phases": [{"name": "p", "duration": "1s"}],
                                "path": [{"kind": "stream", "name": "s"}, {"kind": "caddy"}]})
    assert [h.name for h in exp.path] == ["s", "caddy"]
    with pytest.raises(ExperimentInvalid) as info:
        experiment_from_dict({"name": "d", "phases": [{"name": "p", "duration": "1s"}], "path": [{"kind": "envoy"}]})
    assert info.value.problems[0].path == "path[0].kind"


def test_the_path_start_allowance_is_its_hops_own() -> None:
    exp = parse_experiment(HEAD + "path: [{kind: stream}, {kind: nginx}, {kind: url, url: 'http://127.0.0.1:1'}]\n")
    # stream 15 s + nginx's own start-up (30 s) and its version and check (10 s) + a url hop, which starts nothing
    assert start_allowance_s(exp) == 55.0
    assert start_allowance_s(parse_experiment(HEAD)) == 0.0


def test_the_kept_copy_names_a_gateway_config_by_its_resolved_path(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "nginx.conf").write_text("listen {{listen}};\n", encoding="utf-8")
    exp_file = tmp_path / "exp.yaml"
    exp_file.write_text(HEAD + "path:\n  - kind: nginx\n    config: conf/nginx.conf\n", encoding="utf-8")
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    save_experiment(load_experiment(exp_file), run_dir)
    kept = (run_dir / "experiment.yaml").read_text(encoding="utf-8")
    assert f'config: "{tmp_path / "conf" / "nginx.conf"}"' in kept
    assert load_experiment(run_dir / "experiment.yaml").path[0].config == str(tmp_path / "conf" / "nginx.conf")


def test_the_dry_run_accounts_for_each_hop_target_outward(monkeypatch: pytest.MonkeyPatch) -> None:
    from chaos.hops.gateways.nginx import Nginx

    monkeypatch.setattr(Nginx, "binaries", ("nginx-that-is-not-here",))  # the run could not start nginx here
    exp = parse_experiment(HEAD + "path:\n  - {kind: stream, name: outer}\n  - {kind: nginx}\n"
                           "  - {kind: toxiproxy, server: embedded}\n")
    out = asyncio.run(dry_run(exp))
    text = "\n".join(out.lines)
    assert "path: load -> outer (stream) -> nginx (nginx) -> toxiproxy (toxiproxy) -> target" in text
    assert "start allowance 75s" in text  # stream 15 s + nginx 40 s + toxiproxy 20 s
    assert text.index("hop 'toxiproxy' (toxiproxy)") < text.index("hop 'nginx' (nginx)") < \
        text.index("hop 'outer' (stream)")  # in the order they would start
    assert "NOT POSSIBLE HERE: nginx: no nginx binary here (looked for nginx-that-is-not-here); install it: apt " \
        "install nginx-light" in text and out.exit_code == 4
    assert "through the path, to hop 'outer' first" in text
    assert "contacted: nothing" in text


def _tap(seq: int, hop: str = "edge") -> str:
    return to_json(TapRecord(hop=hop, seq=seq, request_id=f"r{seq}", target="/v1/completions", t_accept=seq,
                             up=[[seq, "data", "ab"]], down=[[seq + 1, "data", "ab"]], up_end="done",
                             down_end="done"))


def test_a_taps_file_is_read_bounded_and_never_through_a_link(tmp_path: Path) -> None:
    taps = tmp_path / "edge.taps.jsonl"
    taps.write_text("\n".join([_tap(1), "{half a li", _tap(2, hop="other"), _tap(3)]) + "\n", encoding="utf-8")
    found = read_taps(taps, "edge")
    assert [t.seq for t in found.records] == [1, 2, 3] and found.unreadable == 1
    assert {t.hop for t in found.records} == {"edge"}  # the path's name for the hop, whatever the line says
    assert found.records[0].up == [[1, "data", "ab"]]
    capped = read_taps(taps, "edge", cap=2)
    assert len(capped.records) == 2 and capped.over_cap == 1
    assert MAX_TAP_RECORDS == 50_000
    link = tmp_path / "link.jsonl"
    os.symlink(taps, link)
    refused = read_taps(link, "edge")
    assert refused.records == [] and refused.error is not None
    assert json.loads(_tap(1))["type"] == "tap"


def test_taps_above_the_event_budget_are_sampled_across_the_whole_run(tmp_path: Path) -> None:
    """Memory is bounded by events, not records: 64 requests of 2 events each against a budget of 40
    keep the events of every 4th request (spread over the run, not its first minutes) and the stamps,
    ends and counts of all of them; the stripped ones count as capped."""
    taps = tmp_path / "edge.taps.jsonl"
    taps.write_text("\n".join(_tap(seq) for seq in range(1, 65)) + "\n", encoding="utf-8")
    found = read_taps(taps, "edge", event_cap=40)
    assert len(found.records) == 64 and found.stride == 4 and found.events <= 40
    kept = [t.seq for t in found.records if t.up]
    assert kept == list(range(4, 65, 4))  # early and late requests alike
    stripped = [t for t in found.records if not t.up]
    assert all(t.dropped_up == 1 and t.dropped_down == 1 and t.up_end == "done" for t in stripped)
    assert found.events_sampled_out == 2 * len(stripped)
    assert read_taps(taps, "edge").stride == 1  # under the default budget nothing is sampled


def test_a_url_hop_elsewhere_is_refused_unless_allowed(tmp_path: Path) -> None:
    from chaos.execution.path import running_path
    from chaos.execution.proxy import RunOwner
    from chaos.model.context import TargetInfo
    from chaos.model.errors import TargetNotAllowed

    text = HEAD + "path: [{kind: url, url: 'http://gateway.example.invalid:8080/v1'}]\n"
    out = asyncio.run(dry_run(parse_experiment(text)))
    assert "REFUSED: neither on this host's loopback" in "\n".join(out.lines) and out.exit_code == 2
    allowed = parse_experiment(text + "safety: {allowed_targets: {hosts: [gateway.example.invalid]}}\n")
    assert asyncio.run(dry_run(allowed)).exit_code == 0

    async def enter() -> None:
        owner = RunOwner(run_id="r", run_dir=tmp_path, record=lambda body: None)
        async with running_path(parse_experiment(text), TargetInfo(kind="openai", base_url="http://127.0.0.1:9/v1"),
                                tmp_path, lambda body: None, owner=owner):
            raise AssertionError("the path came up")

    with pytest.raises(TargetNotAllowed, match="gateway.example.invalid"):
        asyncio.run(enter())


def test_a_url_hop_elsewhere_is_checked_before_anything_starts() -> None:
    """The blast-radius check covers a url hop like the target: refused before the target is started
    (minutes on vLLM), and the dry run names it as checked."""
    from chaos.model.allowlist import enforce as enforce_allowed_targets
    from chaos.model.errors import TargetNotAllowed

    text = HEAD + "path: [{kind: url, url: 'http://gateway.example.invalid:8080/v1'}]\n"
    with pytest.raises(TargetNotAllowed, match="path hop url"):
        enforce_allowed_targets(parse_experiment(text))
    allowed = parse_experiment(text + "safety: {allowed_targets: {hosts: [gateway.example.invalid]}}\n")
    assert [r.what for r in enforce_allowed_targets(allowed)] == ["path hop url (url)"]
