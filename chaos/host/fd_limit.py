"""The open-file limit a run needs: raised to it (up to the hard limit) before anything starts.

Every stream is a socket in the load generator, two in a Toxiproxy in the path (client side and
upstream) and one in the server; each of those processes inherits the runner's limit when it is
raised before they start. The common soft limit of 1,024 would otherwise cap a run near 1,000
streams with ``EMFILE`` deep in a connect; a hard limit too low for the run is one clear error
before anything is started, naming what to change.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

from chaos.model.errors import SetupFailed

__all__ = ["FdLimit", "RESERVE_FDS", "SOCKETS_PER_STREAM", "ensure_open_files", "open_files_needed"]

SOCKETS_PER_STREAM = 2  # the most any one process holds per stream: a proxy's two ends
RESERVE_FDS = 256  # the process's own files: journal, logs, pipes, scrapes, libraries, the event loop


@dataclass(frozen=True)
class FdLimit:
    """What the run needed and what the limit was before and after (``raised``: this run raised it)."""

    needed: int
    soft_before: int
    soft: int
    hard: int

    @property
    def raised(self) -> bool:
        return self.soft != self.soft_before

    def to_dict(self) -> dict[str, int | bool]:
        return {"needed": self.needed, "soft_before": self.soft_before, "soft": self.soft,
                "hard": self.hard, "raised": self.raised}


def open_files_needed(streams: int, sockets_per_stream: int = SOCKETS_PER_STREAM) -> int:
    """File descriptors one process of the run may need for ``streams`` concurrent streams (a
    process that only drives load, such as a shard, holds one socket a stream). Pure."""
    return max(0, streams) * sockets_per_stream + RESERVE_FDS


def _shown(limit: int) -> int:
    return -1 if limit == resource.RLIM_INFINITY else limit


def ensure_open_files(needed: int) -> FdLimit:
    """Raise this process's soft ``RLIMIT_NOFILE`` to ``needed`` when it is lower (children started
    afterwards inherit it); ``SetupFailed`` (exit 4) when the hard limit does not allow it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return FdLimit(needed, _shown(soft), _shown(soft), _shown(hard))
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise SetupFailed(
            f"this run needs about {needed} open files per process (its streams, the proxy's two sockets each, "
            f"{RESERVE_FDS} spare) but the hard limit is {hard}: raise it (`ulimit -Hn {needed}` as root, "
            f"LimitNOFILE={needed} in a systemd unit, `--ulimit nofile={needed}:{needed}` for a container) "
            "or lower load.concurrency"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    return FdLimit(needed, soft, needed, _shown(hard))
