"""``python -m chaos.stack``: the same as ``streamchaos stack serve``."""

from chaos.stack.serve import serve_main

raise SystemExit(serve_main())
