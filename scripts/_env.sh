# Sourced by scripts/try and scripts/test: use the active environment if it already has streamchaos
# installed, else create .venv once and install the project into it (CPU torch pinned).
# The check only looks the modules up (importlib.util.find_spec): importing torch and transformers
# to see whether they are there took ~6 s on every call.
_streamchaos_env_ok() {
  "$1" -c "import importlib.util, sys; sys.exit(any(importlib.util.find_spec(m) is None for m in
    ('chaos.cli', 'torch', 'pytest', 'hypothesis', 'transformers', 'matplotlib', 'rich', 'httptools', 'xdist')))" >/dev/null 2>&1
}
if ! _streamchaos_env_ok python3; then
  if [ ! -x .venv/bin/python ]; then
    # the locked set needs 3.11.5 or newer (pymdown-extensions 13.1.2): Debian 12's python3 is 3.11.2,
    # where pip otherwise fails after a minute with a resolver conflict that names no Python version
    if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11, 5))' 2>/dev/null; then
      # the next step: .venv made with a newer Python is used as it is (the check above is for python3 only)
      {
        echo "streamchaos needs Python 3.11.5 or newer for its locked packages; python3 here is $(python3 -V 2>&1)."
        echo "Make .venv with a newer Python, then run this again (it installs into that .venv):"
        echo "  uv venv --seed --python '>=3.11.5,<3.12' .venv    # uv finds or fetches one (https://docs.astral.sh/uv/)"
        echo "  or: pyenv install 3.11.9 && ~/.pyenv/versions/3.11.9/bin/python -m venv .venv"
        echo "  or, with a 3.11.5 or newer elsewhere on this host: /path/to/python3.11 -m venv .venv"
      } >&2
      exit 4
    fi
    echo "setting up .venv (first run only)..." >&2
    python3 -m venv .venv
  fi
  if ! _streamchaos_env_ok .venv/bin/python; then
    # the versions CI locks (.ci/constraints.txt), torch as the CPU build (scripts/_torch_index.sh);
    # pip's progress shows: the first run downloads ~1 GB (about 3 min, 2 GB in .venv)
    source scripts/_torch_index.sh
    # shellcheck disable=SC2046  # torch_index_args is zero or two words
    .venv/bin/python -m pip install -c .ci/constraints.txt $(torch_index_args) -e '.[dev]'
  fi
  export PATH="$PWD/.venv/bin:$PATH"
fi
