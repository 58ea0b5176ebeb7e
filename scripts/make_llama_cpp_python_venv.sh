#!/usr/bin/env bash
# Make the virtualenv of llama-cpp-python's OpenAI-compatible server (`python -m llama_cpp.server`) from
# .ci/llamacpp-python-lock.txt, every file hashed, its bindings loading the llama.cpp that
# scripts/build_llama_server.sh built (one build of the C++ for both servers):
#
#   scripts/make_llama_cpp_python_venv.sh VENV LIBDIR
#
# LIBDIR holds libllama.so and ggml's libraries (the build's DEST/lib). llama-cpp-python is built from
# its source distribution with CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF": cmake configures, nothing
# is compiled, and the package carries no llama.cpp of its own. Its build requirements (scikit-build-core,
# cmake, ninja) come from the same lock and are installed first, so the build runs without isolation and
# nothing unhashed is fetched. Needs CPython 3.11 (PYTHON, else python3; the lock is resolved for it on
# Linux x86_64) and a C and C++ compiler (cmake's project() looks for them even with nothing to compile).
# VENV/.streamchaos-llamacpp-python-lock records the hash of the lock and of this script: a VENV made
# from the same two is used as it is. Serve with:
#
#   LLAMA_CPP_LIB_PATH=LIBDIR VENV/bin/python -m llama_cpp.server --model M.gguf --host 127.0.0.1 --port 8000 \
#     --n_threads 1 [--interrupt_requests False]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
[ $# -eq 2 ] || { echo "usage: $0 VENV LIBDIR" >&2; exit 2; }
venv="$1"
libdir="$(cd "$2" && pwd)"
python="${PYTHON:-python3}"
lock="$root/.ci/llamacpp-python-lock.txt"
stamp="$venv/.streamchaos-llamacpp-python-lock"
lock_hash=$(cat "$lock" "$0" | sha256sum | cut -d' ' -f1)
# the bindings load LIBDIR's libraries and the server's modules import: a quick check of a made venv
imports() {
  LLAMA_CPP_LIB_PATH="$libdir" "$venv/bin/python" -c "import llama_cpp, llama_cpp.server.app" >/dev/null 2>&1
}
[ -f "$libdir/libllama.so" ] || { echo "make_llama_cpp_python_venv: no libllama.so in $libdir" >&2; exit 2; }
if [ "$(cat "$stamp" 2>/dev/null)" = "$lock_hash" ] && imports; then
  echo "llama-cpp-python virtualenv already made from this lock: $venv"
  exit 0
fi
for tool in cc c++; do
  command -v "$tool" >/dev/null 2>&1 || { echo "make_llama_cpp_python_venv: $tool is not installed (apt-get install g++)" >&2; exit 2; }
done
"$python" -c "import sys; sys.exit(sys.version_info[:2] != (3, 11))" \
  || echo "make_llama_cpp_python_venv: WARNING: $("$python" -V) is not the 3.11 the lock is resolved for" >&2
work=$(mktemp -d "${TMPDIR:-/tmp}/llamacpp-python-venv.XXXXXX")
trap 'rm -rf "$work"' EXIT
# the build requirements' entries of the lock (each a pin and its hash lines), installed before the rest
awk -v want="^(scikit-build-core|scikit_build_core|cmake|ninja|packaging|pathspec)==" '
  /^[^ #]/ { keep = ($0 ~ want) } keep' "$lock" >"$work/build-requirements.txt"
[ "$(grep -c '==' "$work/build-requirements.txt")" -ge 3 ] \
  || { echo "make_llama_cpp_python_venv: the lock has no build requirements (run python scripts/lock.py)" >&2; exit 2; }
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
"$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --no-cache-dir --require-hashes --no-deps)
"${pip[@]}" --only-binary :all: -r "$work/build-requirements.txt"
PATH="$venv/bin:$PATH" CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" \
  "${pip[@]}" --no-build-isolation --no-binary llama-cpp-python -r "$lock"
if ls "$venv"/lib/python*/site-packages/llama_cpp/lib/*.so >/dev/null 2>&1; then
  echo "make_llama_cpp_python_venv: the package carries libraries of its own; LLAMA_BUILD=OFF was not honoured" >&2
  exit 1
fi
imports || { LLAMA_CPP_LIB_PATH="$libdir" "$venv/bin/python" -c "import llama_cpp.server.app" >&2; exit 1; }
echo "$lock_hash" >"$stamp"
version=$(LLAMA_CPP_LIB_PATH="$libdir" "$venv/bin/python" -c "import llama_cpp; print(llama_cpp.__version__)")
echo "llama-cpp-python virtualenv made: $venv (llama-cpp-python $version, llama.cpp from $libdir)"
