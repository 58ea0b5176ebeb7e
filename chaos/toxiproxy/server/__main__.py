"""``python -m chaos.toxiproxy.server``: run the embedded Toxiproxy until SIGTERM/SIGINT."""

from .server import main

raise SystemExit(main())
