"""docs/hops.md ("Testing the hops in front of your engine") is true: its hop catalogue is generated
(tests/test_readme.py keeps it fresh), every stream fault kind has its line of what the client sees and
no kind that does not exist has one, its example experiment loads, its nginx template is one the run
fills and nginx's own check takes (where nginx is here), and the loader's words it quotes are the
loader's words."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from chaos.experiment import parse_experiment
from chaos.hops.gateways.base import template_problems, validate_user_config
from chaos.hops.gateways.nginx import Nginx
from chaos.model.errors import ExperimentInvalid
from chaos.output.catalogue import fault_kinds, hop_kinds

pytestmark = pytest.mark.timeout(60)

PAGE = Path(__file__).resolve().parents[1] / "docs" / "hops.md"
_BLOCK = re.compile(r"<!-- hops: (experiment|template) ([\w-]+) -->\n```\w+\n(.*?)```", re.S)


def text() -> str:
    return PAGE.read_text(encoding="utf-8")


def blocks() -> dict[tuple[str, str], str]:
    found = {(what, name): body for what, name, body in _BLOCK.findall(text())}
    assert found, "docs/hops.md has no <!-- hops: ... --> block"
    return found


def test_the_page_is_titled_and_lists_every_hop_kind() -> None:
    page = text()
    assert page.splitlines()[0] == "# Testing the hops in front of your engine"
    for kind in hop_kinds():
        assert f"### `{kind.kind}`" in page, kind.kind


def test_every_stream_fault_kind_has_one_line_of_what_the_client_sees() -> None:
    rows = re.findall(r"^\| `(stream\.\w+)` \| (.+) \|$", text(), re.MULTILINE)
    kinds = sorted(k.kind for k in fault_kinds() if k.kind.startswith("stream."))
    assert kinds and sorted(kind for kind, _ in rows) == kinds
    assert all(len(seen) > 15 for _, seen in rows)


def test_the_example_experiment_loads() -> None:
    exp = parse_experiment(blocks()[("experiment", "around-nginx")], "docs/hops.md")
    assert [(h.kind, h.name) for h in exp.path] == [("stream", "outer"), ("nginx", "nginx"), ("stream", "inner")]
    assert {e.spec.kind for e in exp.sla} == {"early_close", "relay"}


def test_the_nginx_template_is_one_the_run_fills_and_nginx_takes(tmp_path: Path) -> None:
    template = blocks()[("template", "nginx")]
    assert template_problems(template) == []
    path = tmp_path / "my-nginx.conf"
    path.write_text(template, encoding="utf-8")
    if shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists():
        pytest.skip("no nginx here to check it with")
    assert validate_user_config(Nginx(), path) == []  # `nginx -t` on it, as the loader runs it


@pytest.mark.parametrize(("path", "over"), [
    ("[{kind: stream, name: outer}, {kind: nginx}, {kind: stream, name: inner}]", "ngnix"),
    ("[{kind: nginx}, {kind: stream, name: inner}]", "nginx"),
])
def test_the_loader_messages_it_quotes_are_the_loaders(path: str, over: str) -> None:
    with pytest.raises(ExperimentInvalid) as info:
        parse_experiment(f"name: q\nphases: [{{name: a, duration: 1s}}]\npath: {path}\n"
                         f"sla: [{{kind: relay, over: {over}}}]\n")
    (problem,) = info.value.problems
    assert f"> `{problem.message}`" in text()
