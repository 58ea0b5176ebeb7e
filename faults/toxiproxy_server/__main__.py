"""``python -m faults.toxiproxy_server``: run the embedded Toxiproxy until SIGTERM/SIGINT."""

from .server import main

raise SystemExit(main())
