# Sourced by scripts/_env.sh and .ci/run: the pip arguments that select PyTorch's CPU build.
# .ci/constraints.txt and .ci/lock.txt pin torch==X+cpu, which PyPI does not have (its torch for
# Linux x86_64 is the CUDA build, with ~20 nvidia-* packages and GBs to download): PyTorch's CPU
# index has it. A machine that cannot resolve that host (an offline mirror with its own CPU wheel
# in pip's find-links) is not sent there: an unreachable index costs pip retries on every package.
torch_index_args() {
  if python3 -c "import socket; socket.getaddrinfo('download.pytorch.org', 443)" >/dev/null 2>&1; then
    echo "--extra-index-url https://download.pytorch.org/whl/cpu"
  fi
}
