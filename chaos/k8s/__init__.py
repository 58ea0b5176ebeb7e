"""Kubernetes: the API as streamchaos uses it (official ``kubernetes`` client, extra ``k8s``).

One room, one job: reaching a cluster's API server and describing what is there. ``rbac`` (the
rules a target or fault needs) and ``pods`` (facts about pod objects) are pure and import nothing
of ours; ``errors`` turns API refusals into messages that say what grant or budget would allow the
call; ``client`` is the connection (config from configuration, never from a journal); ``watch``
follows the target's pods; ``relay`` carries the load to ready pods (their IPs or a port-forward);
``manifests`` writes the RBAC an experiment needs. The target itself (``target.kind: kubernetes``)
is ``chaos.targets.kubernetes``, which drives this room.

The ``kubernetes`` package is imported lazily (it costs about 0.5 s and is an optional extra), so
importing ``faults`` or ``chaos`` never pays for it.
"""
