"""``python -m chaos.hops.streamhop``: run the stream hop until SIGTERM/SIGINT (see ``server``)."""

from .server import main

raise SystemExit(main())
