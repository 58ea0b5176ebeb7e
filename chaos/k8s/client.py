"""The connection to a Kubernetes API server, through the official client (``kubernetes.aio``).

Configuration comes from configuration only: the experiment's ``target.kubernetes.kubeconfig`` and
``context``, else ``$KUBECONFIG`` (its first existing file), ``~/.kube/config``, and inside a pod the
mounted service-account token. ``kubernetes.config.load_config`` is not used: it prints to stdout
when it falls back, and a rollback must never load a kubeconfig a journal names (a kubeconfig can
run commands through an exec plugin). Every call returns plain dicts (the objects as the API server
sent them, camelCase) and turns a refusal into a clear error (``chaos.k8s.errors``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Awaitable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from chaos.k8s.errors import Call, refusal, unreachable
from chaos.k8s.pods import selector_text
from chaos.model.errors import ChaosError, FaultError, FaultUnsupported, SetupFailed

__all__ = ["CALL_TIMEOUT_S", "KubeApi", "config_source", "default_namespace", "require_client", "sync_client"]

CALL_TIMEOUT_S = 15.0  # one API call; a watch stream has its own, longer bound
WATCH_WINDOW_S = 60  # a watch is re-opened this often (the server ends it), so a dead stream never goes unnoticed
INCLUSTER_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
INCLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
KUBECONFIG_ENV = "STREAMCHAOS_KUBECONFIG"  # a rollback's (and the watchdog's) kubeconfig, beside $KUBECONFIG
CONTEXT_ENV = "STREAMCHAOS_KUBE_CONTEXT"

T = TypeVar("T")


def require_client(what: str, error: type[ChaosError] = FaultUnsupported) -> None:
    """Refuse clearly when the optional ``kubernetes`` package is not installed."""
    import importlib.util

    if importlib.util.find_spec("kubernetes") is None:
        raise error(f"{what} needs the Kubernetes client: in the streamchaos clone, pip install -e '.[k8s]' "
                    "(the kubernetes package)")


def config_source(kubeconfig: str | None, environ: Mapping[str, str] = os.environ) -> Path | None:
    """The kubeconfig file to load, or None for the in-cluster service account. Pure but for file checks."""
    if kubeconfig:
        return Path(os.path.expanduser(kubeconfig))
    for candidate in (environ.get(KUBECONFIG_ENV, ""), *environ.get("KUBECONFIG", "").split(os.pathsep)):
        if candidate and Path(os.path.expanduser(candidate)).is_file():
            return Path(os.path.expanduser(candidate))
    default = Path(os.path.expanduser("~/.kube/config"))
    if default.is_file():
        return default
    return None


def default_namespace(kubeconfig: str | None, context: str | None) -> str:
    """The namespace kubectl would use: the context's, else the pod's own (in a cluster), else ``default``."""
    path = config_source(kubeconfig)
    if path is not None:
        from kubernetes.aio import config

        try:
            contexts, current = config.list_kube_config_contexts(str(path))
        except Exception as exc:  # noqa: BLE001 - a broken kubeconfig is reported once, here
            raise SetupFailed(f"cannot read the kubeconfig {path}: {exc}") from None
        chosen = next((c for c in contexts if c.get("name") == context), None) if context else current
        namespace = ((chosen or {}).get("context") or {}).get("namespace")
        return str(namespace) if namespace else "default"
    if INCLUSTER_NAMESPACE.is_file():
        return INCLUSTER_NAMESPACE.read_text(encoding="utf-8").strip() or "default"
    return "default"


def _no_config() -> SetupFailed:
    return SetupFailed(
        "no Kubernetes configuration: give target.kubernetes.kubeconfig, set KUBECONFIG, create ~/.kube/config, or run "
        "in a pod with a service-account token mounted (automountServiceAccountToken: true)"
    )


class KubeApi:
    """One connection to the API server for a target or a fault's injection; ``close()`` it."""

    def __init__(self, api_client: Any, server: str, source: str, error: type[ChaosError]) -> None:
        from kubernetes.aio import client

        self.api_client = api_client
        self.server = server
        self.source = source  # where the configuration came from, for messages
        self.error = error  # SetupFailed for the target, FaultError for faults
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.policy = client.PolicyV1Api(api_client)
        self._ws_client: Any = None
        self._ws_api: Any = None

    @classmethod
    async def connect(cls, kubeconfig: str | None = None, context: str | None = None, *,
                      error: type[ChaosError] = SetupFailed) -> KubeApi:
        require_client("a Kubernetes target or fault", FaultUnsupported if issubclass(error, FaultError) else error)
        from kubernetes.aio import client, config

        configuration = client.Configuration()
        path = config_source(kubeconfig)
        try:
            if path is not None:
                await config.load_kube_config(config_file=str(path), context=context,
                                              client_configuration=configuration,
                                              persist_config=False)
                source = f"kubeconfig {path}" + (f" (context {context})" if context else "")
            elif os.environ.get("KUBERNETES_SERVICE_HOST") and INCLUSTER_TOKEN.is_file():
                config.load_incluster_config(client_configuration=configuration)
                source = "the pod's service account"
            else:
                raise _no_config()
        except ChaosError:
            raise
        except Exception as exc:  # noqa: BLE001 - ConfigException, a bad YAML file, a missing context: all configuration
            raise SetupFailed(f"cannot load the Kubernetes configuration from {path or 'the pod'}: {exc}") from None
        return cls(client.ApiClient(configuration), str(configuration.host), source, error)

    async def close(self) -> None:
        for owned in (self._ws_client, self.api_client):
            if owned is not None:
                with contextlib.suppress(Exception):
                    await owned.close()

    def plain(self, model: Any) -> Any:
        """A client model as the JSON the API server sent (camelCase keys, no None fields)."""
        return self.api_client.sanitize_for_serialization(model)

    async def call(self, call: Call, request: Awaitable[T]) -> T:
        """Await one API call; a refusal or silence becomes our error."""
        from kubernetes.aio.client.exceptions import ApiException

        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation that
            # arrives as the call completes, and a cancelled watch would then read on for its window
            async with asyncio.timeout(CALL_TIMEOUT_S):
                return await request
        except ApiException as exc:
            raise refusal(int(exc.status or 0), exc.body, call, server=self.server, error=self.error) from None
        except (OSError, asyncio.TimeoutError) as exc:
            raise unreachable(self.server, call, exc, self.error) from None
        except Exception as exc:
            import aiohttp

            if isinstance(exc, aiohttp.ClientError):
                raise unreachable(self.server, call, exc, self.error) from None
            raise

    # -- reads ------------------------------------------------------------------------------------------
    async def list_pods(self, namespace: str, labels: Mapping[str, str]) -> tuple[list[dict[str, Any]], str]:
        listed = self.plain(await self.call(Call("list", "pods", namespace), self.core.list_namespaced_pod(
            namespace, label_selector=selector_text(labels) or None, _request_timeout=CALL_TIMEOUT_S)))
        return list(listed.get("items") or []), str((listed.get("metadata") or {}).get("resourceVersion") or "")

    async def read_service(self, namespace: str, name: str) -> dict[str, Any]:
        return dict(self.plain(await self.call(
            Call("get", "services", namespace, name),
            self.core.read_namespaced_service(name, namespace, _request_timeout=CALL_TIMEOUT_S))))

    async def read_deployment(self, namespace: str, name: str) -> dict[str, Any]:
        return dict(self.plain(await self.call(
            Call("get", "deployments", namespace, name, "apps"),
            self.apps.read_namespaced_deployment(name, namespace, _request_timeout=CALL_TIMEOUT_S))))

    async def list_budgets(self, namespace: str) -> list[dict[str, Any]]:
        listed = self.plain(await self.call(
            Call("list", "poddisruptionbudgets", namespace, group="policy"),
            self.policy.list_namespaced_pod_disruption_budget(namespace, _request_timeout=CALL_TIMEOUT_S)))
        return list(listed.get("items") or [])

    # -- writes -----------------------------------------------------------------------------------------
    async def delete_pod(self, namespace: str, name: str, uid: str, grace_s: int | None) -> dict[str, Any]:
        """Delete exactly this pod (its uid is a precondition: a same-named successor is left alone)."""
        from kubernetes.aio import client

        body = client.V1DeleteOptions(grace_period_seconds=grace_s, preconditions=client.V1Preconditions(uid=uid))
        return dict(self.plain(await self.call(Call("delete", "pods", namespace, name), self.core.delete_namespaced_pod(
            name, namespace, grace_period_seconds=grace_s, body=body, _request_timeout=CALL_TIMEOUT_S))) or {})

    async def evict_pod(self, namespace: str, name: str, uid: str, grace_s: int | None) -> tuple[int, bytes]:
        """POST the pod's Eviction (policy/v1); ``(HTTP status, body)``, a refusal included: a 429 needs
        the budget named, which only the caller can do."""
        from kubernetes.aio import client

        options = client.V1DeleteOptions(grace_period_seconds=grace_s, preconditions=client.V1Preconditions(uid=uid))
        eviction = client.V1Eviction(api_version="policy/v1", kind="Eviction",
                                     metadata=client.V1ObjectMeta(name=name, namespace=namespace),
                                     delete_options=options)
        response = await self.call(
            Call("create", "pods/eviction", namespace, name),
            self.core.create_namespaced_pod_eviction_without_preload_content(
                name, namespace, eviction, _request_timeout=CALL_TIMEOUT_S))
        try:
            return int(response.status), await response.read()
        finally:
            response.release()

    async def replace_scale(self, namespace: str, name: str, replicas: int, resource_version: str) -> dict[str, Any]:
        """Set the deployment's replicas if it is still at ``resource_version`` (409 otherwise)."""
        from kubernetes.aio import client

        body = client.V1Scale(api_version="autoscaling/v1", kind="Scale",
                              metadata=client.V1ObjectMeta(name=name, namespace=namespace,
                                                           resource_version=resource_version),
                              spec=client.V1ScaleSpec(replicas=replicas))
        return dict(self.plain(await self.call(Call("update", "deployments/scale", namespace, name, "apps"),
                                               self.apps.replace_namespaced_deployment_scale(name, namespace, body,
                                                                                             _request_timeout=CALL_TIMEOUT_S))))

    # -- the fleet lever's ConfigMap (chaos.fleet.lever; its rules: chaos.k8s.rbac.lever_rules) ---------------
    async def read_configmap(self, namespace: str, name: str, timeout_s: float = CALL_TIMEOUT_S) -> dict[str, Any]:
        return dict(self.plain(await self.call(Call("get", "configmaps", namespace, name),
                                               self.core.read_namespaced_config_map(name, namespace,
                                                                                    _request_timeout=timeout_s))))

    async def write_configmap(self, namespace: str, name: str, data: dict[str, str], *,
                              current: dict[str, Any] | None, labels: dict[str, str] | None = None,
                              timeout_s: float = CALL_TIMEOUT_S) -> None:
        """Create the ConfigMap (``current`` None: 409 when someone else did first), or replace ``current``
        with ``data`` by compare-and-set on its resourceVersion (409 when it changed meanwhile); its other
        keys, binary data, labels and annotations are kept."""
        from kubernetes.aio import client

        if current is None:
            body = client.V1ConfigMap(api_version="v1", kind="ConfigMap", data=data,
                                      metadata=client.V1ObjectMeta(name=name, namespace=namespace, labels=labels))
            await self.call(Call("create", "configmaps", namespace, name),
                            self.core.create_namespaced_config_map(namespace, body, _request_timeout=timeout_s))
            return
        meta = current.get("metadata") or {}
        body = client.V1ConfigMap(
            api_version="v1", kind="ConfigMap", data={**(current.get("data") or {}), **data},
            binary_data=current.get("binaryData"),
            metadata=client.V1ObjectMeta(name=name, namespace=namespace, labels=meta.get("labels"),
                                         annotations=meta.get("annotations"),
                                         resource_version=meta.get("resourceVersion")))
        await self.call(Call("update", "configmaps", namespace, name),
                        self.core.replace_namespaced_config_map(name, namespace, body, _request_timeout=timeout_s))

    # -- streams ----------------------------------------------------------------------------------------
    async def watch_pods(self, namespace: str, labels: Mapping[str, str],
                         resource_version: str) -> AsyncIterator[dict[str, Any]]:
        """Pod events after ``resource_version`` (``{"type", "object"}``, objects as plain dicts) until the
        server ends the window; an ``ERROR`` event (a 410 for an expired version) is yielded as is."""
        call = Call("watch", "pods", namespace)
        response = await self.call(call, self.core.list_namespaced_pod_without_preload_content(
            namespace, label_selector=selector_text(labels) or None, watch=True, resource_version=resource_version,
            timeout_seconds=WATCH_WINDOW_S, allow_watch_bookmarks=True, _request_timeout=WATCH_WINDOW_S + 15))
        try:  # the aiohttp response itself: the body is the event stream
            if response.status >= 400:
                raise refusal(response.status, await response.read(), call, server=self.server, error=self.error)
            while line := await response.content.readline():
                if line.strip():
                    yield json.loads(line)
        finally:
            response.release()

    async def port_forward(self, namespace: str, pod: str, port: int) -> Any:
        """A WebSocket to ``port`` of ``pod`` through the API server (``pods/portforward``,
        v4.channel.k8s.io), opened by the official client; the caller speaks the channel framing."""
        from kubernetes.aio import client
        from kubernetes.aio.stream.ws_client import WsApiClient

        if self._ws_api is None:  # one session for every forwarded connection of this run
            self._ws_client = WsApiClient(configuration=self.api_client.configuration)
            self._ws_api = client.CoreV1Api(self._ws_client)
        call = Call("create", "pods/portforward", namespace, pod, needs=("create", "get"))
        try:
            connecting = await self._ws_api.connect_get_namespaced_pod_portforward_without_preload_content(
                pod, namespace, ports=str(port))
            async with asyncio.timeout(CALL_TIMEOUT_S):
                return await connecting
        except Exception as exc:  # noqa: BLE001 - a refused upgrade, a dead server, a timeout: each said clearly
            status = getattr(exc, "status", None)
            if isinstance(status, int) and status >= 400:
                body = await self._refused_upgrade_body(namespace, pod, port)
                raise refusal(status, body or getattr(exc, "message", ""), call, server=self.server,
                              error=self.error) from None
            raise unreachable(self.server, call, exc, self.error) from None

    async def _refused_upgrade_body(self, namespace: str, pod: str, port: int) -> bytes:
        """The Status body of a refused port-forward upgrade (aiohttp drops it: "Invalid response status"),
        read by asking once more with the same credentials and upgrade headers; empty when none comes."""
        import base64
        import secrets
        from urllib.parse import quote

        configuration = self.api_client.configuration
        headers: dict[str, str] = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
                                   "Sec-WebSocket-Key": base64.b64encode(secrets.token_bytes(16)).decode(),
                                   "Sec-WebSocket-Protocol": "v4.channel.k8s.io"}
        url = f"{configuration.host}/api/v1/namespaces/{quote(namespace)}/pods/{quote(pod)}/portforward?ports={port}"
        with contextlib.suppress(Exception):
            bearer = (await configuration.auth_settings()).get("BearerToken") or {}
            if bearer.get("value"):
                headers[str(bearer.get("key") or "authorization")] = str(bearer["value"])
            rest = self._ws_client.rest_client  # its session: the same TLS and client certificate as the upgrade
            if rest.pool_manager is None:
                rest.pool_manager = rest._create_pool_manager()
            async with asyncio.timeout(CALL_TIMEOUT_S):
                response = await rest.pool_manager.request("GET", url, headers=headers)
                try:
                    if response.status >= 400:
                        return bytes(await response.read())
                finally:
                    response.close()
        return b""


def sync_client(kubeconfig: str | None = None, context: str | None = None) -> tuple[Any, str, str]:
    """``(ApiClient, server, source)`` of the synchronous client, for ``rollback`` in another process.
    Same lookup as ``KubeApi.connect``; ``STREAMCHAOS_KUBECONFIG``/``STREAMCHAOS_KUBE_CONTEXT`` first."""
    require_client("rolling back a Kubernetes fault")
    from kubernetes import client, config

    configuration = client.Configuration()
    path = config_source(kubeconfig)
    context = context or os.environ.get(CONTEXT_ENV) or None
    try:
        if path is not None:
            config.load_kube_config(config_file=str(path), context=context, client_configuration=configuration,
                                    persist_config=False)
            source = f"kubeconfig {path}"
        elif os.environ.get("KUBERNETES_SERVICE_HOST") and INCLUSTER_TOKEN.is_file():
            config.load_incluster_config(client_configuration=configuration)
            source = "the pod's service account"
        else:
            raise _no_config()
    except ChaosError:
        raise
    except Exception as exc:  # noqa: BLE001 - every configuration problem is one clear error
        raise SetupFailed(f"cannot load the Kubernetes configuration from {path or 'the pod'}: {exc}") from None
    return client.ApiClient(configuration), str(configuration.host), source
