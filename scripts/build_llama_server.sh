#!/usr/bin/env bash
# Build llama.cpp's own server (llama-server) from the llama.cpp sources that the llama-cpp-python
# source distribution vendors, and write the builtin tiny model beside it as GGUF:
#
#   scripts/build_llama_server.sh [DEST]      (default /var/cache/streamchaos/llama.cpp)
#
# DEST then holds bin/llama-server, lib/ (llama.cpp's shared libraries: libllama.so and ggml's, which
# llama-server finds through its rpath and llama-cpp-python through LLAMA_CPP_LIB_PATH=DEST/lib), tiny.gguf (the builtin tiny model, seed 0), gguf-py/ (llama.cpp's
# own GGUF package, which writes it: `python -m chaos.stack.engine.gguf_export OUT --gguf-py DEST/gguf-py`)
# and .streamchaos-llamacpp-lock (the hash of the lock and of this script: a DEST built from the same
# two is used as it is).
# The sdist comes from the package index by the hash in .ci/llamacpp-lock.txt; nothing else is
# downloaded (the web UI is not built: LLAMA_BUILD_UI=OFF, LLAMA_USE_PREBUILT_UI=OFF). Needs cmake,
# a C++17 compiler and the project's Python (STREAMCHAOS_PYTHON, else python3) with numpy and torch.
# About 3.5 minutes on 2 cores. Serve it with (one compute thread that sleeps while it waits: ggml's
# threads spin for work, and two spinning threads beside other busy processes on two cores went from
# 0.1 ms to 500 ms a token):
#
#   DEST/bin/llama-server -m DEST/tiny.gguf --host 127.0.0.1 --port 8080 --threads 1 --poll 0 [--metrics]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="${1:-/var/cache/streamchaos/llama.cpp}"
python="${STREAMCHAOS_PYTHON:-python3}"
lock="$root/.ci/llamacpp-lock.txt"
lock_hash=$(cat "$lock" "$0" | sha256sum | cut -d' ' -f1)
# the model from the code as it is now (2 s): the build is kept, the tiny model may have changed since
write_gguf() {
  (cd "$root" && "$python" -m chaos.stack.engine.gguf_export "$1/tiny.gguf.new" --gguf-py "$1/gguf-py" >/dev/null) \
    && mv "$1/tiny.gguf.new" "$1/tiny.gguf"
}
if [ "$(cat "$dest/.streamchaos-llamacpp-lock" 2>/dev/null)" = "$lock_hash" ] && [ -x "$dest/bin/llama-server" ]; then
  write_gguf "$dest" || echo "build_llama_server: WARNING: could not write $dest/tiny.gguf with $python" >&2
  echo "llama-server already built from this lock: $dest"
  exit 0
fi
for tool in cmake c++; do
  command -v "$tool" >/dev/null 2>&1 || { echo "build_llama_server: $tool is not installed (apt-get install cmake g++)" >&2; exit 2; }
done
work=$(mktemp -d "${TMPDIR:-/tmp}/llamacpp-build.XXXXXX")
stage="$dest.new.$$"
trap 'rm -rf "$work" "$stage"' EXIT
# pip prepares an sdist's metadata even to download it, with its build backend (scikit-build-core):
# installed first from the hashed lock of llama-cpp-python's own virtualenv into a throwaway one, so
# nothing unhashed is fetched (build isolation would fetch the backend from the index unchecked)
awk -v want="^(scikit-build-core|scikit_build_core|packaging|pathspec)==" '
  /^[^ #]/ { keep = ($0 ~ want) } keep' "$root/.ci/llamacpp-python-lock.txt" >"$work/backend.txt"
"$python" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --no-cache-dir --require-hashes --no-deps --only-binary :all: \
  -r "$work/backend.txt"
"$work/venv/bin/python" -m pip download -q --no-deps --no-binary :all: --no-build-isolation --require-hashes \
  -r "$lock" -d "$work/sdist"
tar -xzf "$work"/sdist/llama_cpp_python-*.tar.gz -C "$work"
src=$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)
[ -f "$src/tools/server/server.cpp" ] || { echo "build_llama_server: no llama.cpp server sources in the sdist" >&2; exit 2; }
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
# Portable (no -march=native: the cache may move to a machine with other CPU features), no HTTPS
# client, no web UI, no tests or examples: llama-server and the shared libraries it links, with an
# rpath to DEST/lib (the same libraries serve llama-cpp-python's bindings, built without a llama.cpp
# of their own: one build of the C++ for both servers).
cmake -S "$src" -B "$work/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DCMAKE_INSTALL_RPATH='$ORIGIN/../lib' -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON \
  -DGGML_NATIVE=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON >"$work/cmake.log" 2>&1 \
  || { tail -30 "$work/cmake.log" >&2; exit 1; }
cmake --build "$work/build" --target llama-server llama -j "$(nproc)" >"$work/build.log" 2>&1 \
  || { tail -40 "$work/build.log" >&2; exit 1; }
rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/lib"
cp "$work/build/bin/llama-server" "$stage/bin/"
cp -a "$work"/build/bin/lib*.so* "$stage/lib/"
cp -r "$src/gguf-py" "$stage/gguf-py"
cp "$src/LICENSE" "$stage/LICENSE"
write_gguf "$stage" || echo "build_llama_server: WARNING: could not write tiny.gguf with $python (set STREAMCHAOS_PYTHON to the project's)" >&2
"$stage/bin/llama-server" --version >"$stage/version.txt" 2>&1 || true
echo "$lock_hash" >"$stage/.streamchaos-llamacpp-lock"
rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
mv "$stage" "$dest"
echo "llama-server built: $dest/bin/llama-server ($(head -1 "$dest/version.txt"))"
