"""`streamchaos validate` quotes a gateway's own check of a user's configuration against the user's
file: the line the gateway names is a line of that file, not of the throwaway copy the check ran on
(which is gone by the time the user reads the message)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.hops.gateways.base import validate_user_config
from chaos.hops.gateways.nginx import Nginx
from chaos.model.errors import SetupFailed

BROKEN = ("events {}\nhttp {\n  server {\n    listen {{listen}};\n"
          "    location / { proxy_pass {{upstream}}; proxy_bogus_directive on; }\n  }\n}\n")


def test_the_complaint_names_the_users_file_and_line(tmp_path: Path) -> None:
    try:
        Nginx().find_binary()
    except SetupFailed as exc:
        pytest.skip(str(exc))
    config = tmp_path / "edge.conf"
    config.write_text(BROKEN, encoding="utf-8")
    problems = validate_user_config(Nginx(), config, key="path[0].config")
    assert len(problems) == 1, problems
    message = problems[0].message
    assert 'unknown directive "proxy_bogus_directive"' in message, message
    assert f"in {config}:5" in message, message  # the user's file, the line it is on there
    assert "streamchaos-check-" not in message, message  # never the deleted copy
    assert problems[0].file == str(config) and problems[0].path == "path[0].config"
    config.write_text(BROKEN.replace(" proxy_bogus_directive on;", ""), encoding="utf-8")
    assert validate_user_config(Nginx(), config) == []  # the sound file passes the same check
