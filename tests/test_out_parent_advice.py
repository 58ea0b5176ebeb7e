"""An ``--out`` another uid could swap is refused with what would be right (issue 41, review of point 6).

Root in a CI container on a workspace bind-mounted from the host's uid 1001 is the case that matters:
uid 1001 owns the directory the run would go in, so it could swap the run directory for a link and
have root write where it says; the refusal is right, and says how to go on. The repository's own
default (``runs/`` in a checkout of one's own) is taken as before.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from chaos.execution.runner import default_out_dir
from chaos.host.runfiles import prepare_private_dir, release_dir, unsafe_parent
from chaos.model.errors import UsageError

pytestmark = pytest.mark.timeout(30)


def test_root_below_a_workspace_another_uid_owns_is_refused_and_told_how_to_go_on(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    workspace = tmp_path / "workspace"
    workspace.mkdir(mode=0o755)
    os.chown(workspace, 1001, 1001)  # the CI runner's uid on the host, as bind-mounted
    with pytest.raises(UsageError) as caught:
        prepare_private_dir(workspace / "runs" / "r1")
    message = str(caught.value)
    assert f"{workspace} belongs to uid 1001; another user could swap the run directory for a link" in message
    assert "below directories only you (uid 0) or root can write" in message
    assert "give --out outside it (e.g. /tmp/runs/NAME" in message and "chown the checkout to root" in message
    assert not (workspace / "runs").exists()


def test_the_default_runs_directory_of_ones_own_checkout_is_taken(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    clone = tmp_path / "streamchaos"
    clone.mkdir(mode=0o755)
    monkeypatch.chdir(clone)
    out = default_out_dir("exp")
    assert out.parts[0] == "runs" and unsafe_parent(out) is None
    prepare_private_dir(out)
    release_dir(out)
    assert (clone / out).is_dir()
