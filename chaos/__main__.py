"""`python -m chaos` is the `streamchaos` command."""

import sys

from chaos.cli import main

sys.exit(main())
