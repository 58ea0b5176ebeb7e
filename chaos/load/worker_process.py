"""``python -m chaos.load.worker_process INBOX_FD OUTBOX_FD``: one load worker (``chaos.load.workers``).

The worker's main module is this one, never the caller's ``__main__`` (which multiprocessing's
spawn re-ran): a script, ``python -``, a REPL or a notebook calling ``chaos.run()`` runs once.
"""

from __future__ import annotations

import sys

from chaos.load.workers import serve_pipes

if __name__ == "__main__":
    serve_pipes(int(sys.argv[1]), int(sys.argv[2]))
