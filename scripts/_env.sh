# Sourced by scripts/try and scripts/test: use the active environment if it already has streamchaos
# installed, else create .venv once and install the project into it (CPU torch pinned).
if ! python3 -c "import chaos.cli, torch, pytest, hypothesis, transformers, matplotlib, rich, httptools, xdist" >/dev/null 2>&1; then
  if [ ! -x .venv/bin/python ]; then
    echo "setting up .venv (first run only)..." >&2
    python3 -m venv .venv
  fi
  if ! .venv/bin/python -c "import chaos.cli, torch, pytest, hypothesis, transformers, matplotlib, rich, httptools, xdist" >/dev/null 2>&1; then
    .venv/bin/python -m pip install -q -c .ci/constraints.txt -e '.[dev]'
  fi
  export PATH="$PWD/.venv/bin:$PATH"
fi
