"""API refusals as errors that say what was refused, where, and what grant or budget would allow it.

The API server answers a refused call with a ``Status`` object (``reason``, ``message``, ``code``,
``details.causes``); the official client raises it as ``ApiException(status, reason, body)``. These
pure functions turn that into one of our errors: a 403 names the verb, resource and namespace and the
Role rule that would allow it; a 429 on an eviction names the PodDisruptionBudget, what it needs and
what it has (``budget_refusal``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from chaos.model.errors import ChaosError, FaultError, FaultPermissionDenied, FaultRefused, SetupFailed

__all__ = ["Call", "ServerErrors", "budget_refusal", "describe_budget", "refusal", "status_of", "unreachable"]

# A 5xx the API server gives every attempt is the cluster's, not a pod still starting (a real 1.36 cluster
# answered 500 to every port-forward while the pod's node had no address, and a run retried it 908 times in
# two minutes): after this many consecutive attempts over at least this long, the caller stops and says why.
SERVER_ERROR_ATTEMPTS = 5
SERVER_ERROR_SPAN_S = 5.0
SERVER_ERROR_PAUSE_S = (0.5, 1.0, 2.0, 4.0)  # between those attempts (then the last, each time)


class Call:
    """What was asked of the API server, for the message: ``delete pods web-1 in namespace demo``."""

    __slots__ = ("group", "name", "namespace", "needs", "resource", "verb")

    def __init__(self, verb: str, resource: str, namespace: str, name: str | None = None, group: str = "",
                 needs: tuple[str, ...] = ()) -> None:
        self.verb, self.resource, self.namespace, self.name, self.group = verb, resource, namespace, name, group
        self.needs = needs or (verb,)  # the verbs the server checks for it (a port-forward: get and create)

    def __str__(self) -> str:
        target = f"{self.resource} {self.name}" if self.name else self.resource
        return f"{self.verb} {target} in namespace {self.namespace}"

    def grant(self) -> str:
        """The Role rule that allows this call, as YAML flow."""
        verbs = ", ".join(f'"{v}"' for v in self.needs)
        return f'{{apiGroups: ["{self.group}"], resources: ["{self.resource}"], verbs: [{verbs}]}}'


def status_of(body: Any) -> dict[str, Any]:
    """The Status object in an error body (text or bytes or dict); empty when it is not one."""
    if isinstance(body, (bytes, bytearray)):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            return {"message": body.strip()[:300]} if body.strip() else {}
    return dict(body) if isinstance(body, Mapping) else {}


def refusal(code: int, body: Any, call: Call, *, server: str = "", error: type[ChaosError] = FaultError) -> ChaosError:
    """The error for an API call answered with HTTP ``code``; ``error`` is the class for the caller's
    layer (``FaultError`` for faults, ``SetupFailed`` for the target). The code stays on it as
    ``http_status`` (a 409 is retried by compare-and-set callers). Pure."""
    exc = _refusal(code, body, call, server, error)
    exc.http_status = code  # type: ignore[attr-defined]  # ours alone: callers read it with getattr
    return exc


def _refusal(code: int, body: Any, call: Call, server: str, error: type[ChaosError]) -> ChaosError:
    status = status_of(body)
    said = status.get("message") or status.get("reason") or f"HTTP {code}"
    if code == 401:
        return error(f"the API server {server or ''} did not accept the credentials ({said}): the kubeconfig's user or "
                     "the service-account token is wrong or has expired".replace("  ", " "))
    if code == 403:
        cls: type[ChaosError] = FaultPermissionDenied if issubclass(error, FaultError) else error
        both = (f" (an API server from 1.30 checks {' and '.join(call.needs)}: get in its authorization filter, create "
                "on the upgrade)") if call.resource == "pods/portforward" else ""
        return cls(
            f"the API server refused to {call} (403 Forbidden: {said}). The account streamchaos runs as needs a Role "
            f"in namespace {call.namespace} with the rule {call.grant()}{both} and a RoleBinding to it; "
            "`streamchaos manifests rbac EXPERIMENT` prints the Role an experiment needs"
        )
    if code == 404:
        return error(f"could not {call}: it does not exist ({said})")
    if code == 409:
        return error(f"could not {call}: it changed meanwhile (409 Conflict: {said})")
    if code == 422:
        return error(f"the API server rejected {call} as invalid (422: {said})")
    if code == 429:
        return error(f"the API server refused to {call} for now (429 TooManyRequests: {said})")
    if code == 400:
        return error(f"the API server rejected {call} as a bad request (400 BadRequest: {said})")
    if code >= 500:
        reason = status.get("reason") or "server error"
        return error(f"the API server failed to {call}: HTTP {code} {reason} ({said})")
    return error(f"could not {call}: HTTP {code} ({said})")


class ServerErrors:
    """Consecutive attempts that failed on a 5xx from the API server: when to stop retrying, how long to
    pause between tries, and the error that says so. Pure: the caller gives the times (monotonic s)."""

    def __init__(self) -> None:
        self.attempts = 0
        self.first_s = 0.0
        self.last_s = 0.0

    def failed(self, why: BaseException | None, now_s: float) -> bool:
        """Count one failed attempt (``why``: the API server's refusal it met, None for any other failure,
        which starts the count again); True once 5xx answers have lasted long enough to give up."""
        if not isinstance(why, ChaosError) or int(getattr(why, "http_status", 0) or 0) < 500:
            self.attempts = 0
            return False
        if self.attempts == 0:
            self.first_s = now_s
        self.attempts, self.last_s = self.attempts + 1, now_s
        return self.attempts >= SERVER_ERROR_ATTEMPTS and now_s - self.first_s >= SERVER_ERROR_SPAN_S

    def pause_s(self, default_s: float) -> float:
        """Seconds before the next attempt: doubling while 5xx answers go on, else ``default_s``."""
        if not self.attempts:
            return default_s
        return SERVER_ERROR_PAUSE_S[min(self.attempts, len(SERVER_ERROR_PAUSE_S)) - 1]

    def given_up(self, why: ChaosError) -> ChaosError:
        """``why`` (the last 5xx: the call, the status, the API server's message) with how long it lasted."""
        code = int(getattr(why, "http_status", 0) or 0)
        exc = type(why)(f"{why}. The API server answered {code} to each of {self.attempts} consecutive attempts "
                        f"over {self.last_s - self.first_s:.1f}s, so streamchaos stops here instead of retrying: a "
                        "server error that lasts is the cluster's (for a port-forward, e.g. a node without an "
                        "address: kubectl get nodes -o wide)")
        exc.http_status = code  # type: ignore[attr-defined]  # ours alone, as refusal() sets it
        return exc


def describe_budget(pdb: Mapping[str, Any]) -> str:
    """``budget web (minAvailable 3): 3 of 3 pods healthy, 0 disruptions allowed``. Pure."""
    spec, status = pdb.get("spec") or {}, pdb.get("status") or {}
    rule = next((f"{k} {spec[k]}" for k in ("minAvailable", "maxUnavailable") if k in spec),
                "no minAvailable/maxUnavailable")
    return (f"PodDisruptionBudget {(pdb.get('metadata') or {}).get('name')} ({rule}): "
            f"{status.get('currentHealthy', '?')} healthy pods, needs {status.get('desiredHealthy', '?')}, "
            f"{status.get('disruptionsAllowed', '?')} disruptions allowed")


def budget_refusal(body: Any, call: Call, budgets: Sequence[Mapping[str, Any]], *,
                   retried_s: float = 0.0) -> FaultRefused:
    """An eviction refused with 429 because of a PodDisruptionBudget: which budget, what it needs and
    has, and what would allow the eviction. ``budgets`` are the PDBs that select the pod (may be empty
    when they could not be read). Pure."""
    status = status_of(body)
    causes = [c.get("message", "") for c in (status.get("details") or {}).get("causes") or [] if isinstance(c, Mapping)]
    said = "; ".join(c for c in causes if c) or status.get("message") or "429 TooManyRequests"
    named = "; ".join(describe_budget(b) for b in budgets) or ("the PodDisruptionBudget could not be read (grant list "
                                                               "poddisruptionbudgets to name it)")
    waited = f" after retrying for {retried_s:g}s" if retried_s else ""
    return FaultRefused(
        f"the API server refused to {call}{waited}: it would violate the pod's disruption budget ({said}). {named}. "
        "Nothing was changed (nothing to roll back). "
        "An eviction is allowed while the budget allows a disruption: lower minAvailable (or raise maxUnavailable), "
        "add replicas, give the fault retry_for so it waits for one, or use k8s.pod_kill (which ignores budgets)"
    )


def unreachable(server: str, call: Call, exc: BaseException, error: type[ChaosError] = SetupFailed) -> ChaosError:
    """The API server did not answer at all."""
    return error(f"the API server {server} did not answer ({call}): {type(exc).__name__}: {exc}")
