"""`path[].kind: litellm`: the LiteLLM proxy (PyPI ``litellm[proxy]``) of this interpreter's environment.

Its shipped configuration routes every model name (``model_name: "*"``) to the upstream as an
OpenAI-compatible model (``openai/*`` with ``api_base``), so whatever model the load asks for reaches
the engine under the same name. Keys never appear in the file: ``master_key_env`` (the key clients
must send) and ``upstream_key_env`` (the key it sends upstream) name environment variables, written
as LiteLLM's ``os.environ/NAME`` references, and its check refuses a configuration whose referenced
variable is not set (LiteLLM would otherwise run without the key, open to anyone on this host).

Without ``master_key_env`` it accepts every request, as the builtin stack does (LiteLLM 1.108
refuses to start keyless unless told ``dangerously_permit_weak_or_unset_master_key``, which the
shipped configuration then says: the hop listens on loopback only). LiteLLM also reads
``LITELLM_MASTER_KEY`` from the environment, which the hop inherits from the runner.

The shipped configuration also sets ``forward_client_headers_to_llm_api: true``: LiteLLM then sends
the client's ``x-`` headers upstream (``X-Request-Id`` among them; never its key headers, which it
strips: ``x-api-key``, ``x-litellm-api-key``, ``x-goog-api-key``, ``x-mcp-auth``, ...), so the stream
hops behind it tap each request under the client's id. Without it, a tap behind LiteLLM has no request
id and ``abort_path`` can pair it only by arrival order.

Where it listens is its command line (``--host 127.0.0.1 --port P``), not its configuration, so a
user's ``config:`` needs no ``{{listen}}``. Its version is read from the package's metadata by its own
interpreter: ``litellm --version`` imports the whole proxy (11.7 s measured here).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from chaos.hops.gateways.base import Gateway, Upstream, gateway_kind, run_tool
from chaos.host.children import script_interpreter
from chaos.model.errors import SetupFailed
from chaos.model.params import Param, Schema

__all__ = ["Litellm"]

PROXY_MODULES = ("litellm", "fastapi", "uvicorn", "apscheduler", "orjson")  # what `litellm[proxy]` serves with
_ENV_REF = re.compile(r"os\.environ/([A-Za-z_][A-Za-z0-9_]*)")
_VERSION_PROBE = "import importlib.metadata as m; print(m.version('litellm'))"


@gateway_kind
class Litellm(Gateway):
    """``litellm --config FILE --host 127.0.0.1 --port P --num_workers 1``, from this environment."""

    kind = "litellm"
    binaries = (str(Path(sys.executable).parent / "litellm"),)
    install_hint = "pip install 'litellm[proxy]' into this Python environment (streamchaos's 'thirdparty' extra)"
    config_name = "config.yaml"
    listen_in_config = False
    startup_timeout_s = 180.0  # importing the proxy takes 8-10 s of CPU; more beside a busy run
    options = Schema((
        Param("master_key_env", "str", None,
              doc="the environment variable holding the proxy's master key (clients then must send it)"),
        Param("upstream_key_env", "str", None, doc="the environment variable holding the key it sends upstream"),
        Param("timeout", "duration", 600.0, min=0.001, doc="LiteLLM's timeout for each upstream request"),
        Param("api_path", "str", "/v1", doc="the upstream's OpenAI API root path"),
    ))

    def find_binary(self, search_path: str | None = None) -> str:
        binary = super().find_binary(search_path)
        missing = [m for m in PROXY_MODULES if importlib.util.find_spec(m) is None]  # found, not imported
        if missing:
            raise SetupFailed(f"litellm: the proxy's modules are missing here ({', '.join(missing)});"
                              f" install it: {self.install_hint}")
        return binary

    def version(self, binary: str) -> str:
        python = script_interpreter(binary)
        if python is not None:
            status, text = run_tool([python, "-c", _VERSION_PROBE])
            if status == 0 and text:
                return text.splitlines()[-1]
        try:
            return str(importlib.metadata.version("litellm"))
        except importlib.metadata.PackageNotFoundError:
            return "unknown"

    def render(self, listen_port: int, upstream_root: str, workdir: Path, options: Mapping[str, Any]) -> str:
        o = self.effective_options(options)
        upstream = Upstream.parse(upstream_root)
        params: dict[str, Any] = {
            "model": "openai/*",
            "api_base": upstream.root + "/" + str(o["api_path"]).strip("/"),
            "api_key": f"os.environ/{o['upstream_key_env']}" if o["upstream_key_env"] else "none",
            "timeout": float(o["timeout"]),
        }
        config: dict[str, Any] = {"model_list": [{"model_name": "*", "litellm_params": params}]}
        if o["master_key_env"]:
            settings: dict[str, Any] = {"master_key": f"os.environ/{o['master_key_env']}"}
        else:  # LiteLLM 1.108 refuses to start keyless without this; the hop answers this host only
            settings = {"dangerously_permit_weak_or_unset_master_key": True}
        # the client's X-Request-Id must reach the upstream, or the taps behind LiteLLM cannot be told
        # apart per stream (abort_path, relay): LiteLLM forwards x- headers only when told to
        settings["forward_client_headers_to_llm_api"] = True
        config["general_settings"] = settings
        return "# streamchaos: litellm hop, shipped configuration\n" + str(yaml.safe_dump(config, sort_keys=False))

    def environment(self, workdir: Path) -> dict[str, str]:
        # quiet, offline (the cost map is the package's own, never fetched), no docs pages
        return {"LITELLM_LOG": "ERROR", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "NO_DOCS": "True"}

    def check(self, binary: str, config_path: Path, workdir: Path) -> str | None:
        try:
            text = config_path.read_text(encoding="utf-8")
            config = yaml.safe_load(text)
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            return f"{config_path}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        models = config.get("model_list") if isinstance(config, dict) else None
        if not isinstance(models, list) or not models:
            return f"{config_path}: no model_list (a list of {{model_name, litellm_params}}): nothing would be routed"
        for i, entry in enumerate(models):
            if not isinstance(entry, dict) or "model_name" not in entry or "litellm_params" not in entry:
                return f"{config_path}: model_list[{i}] needs model_name and litellm_params"
        unset = sorted({name for name in _ENV_REF.findall(text) if not os.environ.get(name)})
        if unset:
            return f"{config_path}: it references os.environ/{unset[0]}, which is not set in the runner's environment"
        return None

    def command(self, binary: str, config_path: Path, workdir: Path, port: int) -> list[str]:
        return [binary, "--config", str(config_path), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
