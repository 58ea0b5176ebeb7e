"""The credentials a run sends: the target's API key and the metrics endpoint's, from configuration.

The API key comes from ``--api-key-env NAME`` (the CLI), ``target.api_key_env: NAME``, or
``target.api_key`` (a secret written in the file: discouraged), in that order. The metrics
endpoint gets, by ``target.metrics_auth``: ``api_key`` (the default: the target's key; a gateway
such as LiteLLM wants its master key on ``/metrics`` too), ``none``, ``env:NAME`` or ``file:PATH``
(a bearer token). Values are never written to the journal, the report or a log: only where they
came from is (``describe``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from chaos.host.redact import register_secret
from chaos.model.errors import UsageError

__all__ = ["Credentials", "resolve"]


@dataclass(frozen=True)
class Credentials:
    """The run's secrets (kept out of reprs) and where each came from (safe to record)."""

    api_key: str | None = field(default=None, repr=False)
    metrics_token: str | None = field(default=None, repr=False)
    api_key_source: str = "none"
    metrics_source: str = "none"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def metrics_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.metrics_token}"} if self.metrics_token else {}

    def describe(self) -> dict[str, str]:
        """Where the credentials came from, never what they are."""
        return {"api_key": self.api_key_source, "metrics_auth": self.metrics_source}


def _from_env(name: str, what: str, environ: Mapping[str, str]) -> str:
    value = environ.get(name, "").strip()
    if not value:
        raise UsageError(f"{what}: the environment variable {name} is not set (or empty); export it before the run")
    return value


def resolve(api_key: str | None, api_key_env: str | None, metrics_auth: str, *, cli_api_key_env: str | None = None,
            environ: Mapping[str, str] = os.environ) -> Credentials:
    """The run's credentials; ``UsageError`` (exit 2) when a named variable or file is missing."""
    if cli_api_key_env:
        key, source = _from_env(cli_api_key_env, "--api-key-env", environ), f"env:{cli_api_key_env} (--api-key-env)"
    elif api_key_env:
        key, source = _from_env(api_key_env, "target.api_key_env", environ), f"env:{api_key_env}"
    elif api_key:
        key, source = api_key, "target.api_key"
    else:
        key, source = None, "none"
    token: str | None
    if metrics_auth == "api_key":
        token, msource = key, f"the target's ({source})" if key else "none"
    elif metrics_auth == "none":
        token, msource = None, "none"
    elif metrics_auth.startswith("env:"):
        token, msource = _from_env(metrics_auth[4:], "target.metrics_auth", environ), metrics_auth
    elif metrics_auth.startswith("file:"):
        path = Path(os.path.expanduser(metrics_auth[5:]))
        try:
            token = path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise UsageError(f"target.metrics_auth: cannot read {path}: {exc.strerror}") from None
        msource = f"file:{path}"
    else:
        raise UsageError(f"target.metrics_auth: expected api_key, none, env:NAME or file:PATH, found {metrics_auth!r}")
    register_secret(key)  # redacted from everything the run records or prints (chaos.host.redact)
    register_secret(token)
    return Credentials(key, token or None, source, msource)
