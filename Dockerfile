# The streamchaos image the Kubernetes game-day manifests run (manifests/cronjob.yaml).
#   docker build -t streamchaos:latest .
# CPU PyTorch is pinned through .ci/constraints.txt; the builtin stack is not used in-cluster (the
# game-day targets a running vLLM), but the package installs it so every command works.
FROM python:3.11-slim
WORKDIR /opt/streamchaos
COPY pyproject.toml README.md ./
COPY .ci/constraints.txt .ci/constraints.txt
COPY chaos chaos
COPY faults faults
COPY sla sla
RUN pip install --no-cache-dir --extra-index-url https://download.pytorch.org/whl/cpu -c .ci/constraints.txt ".[k8s]" \
    && useradd --uid 10001 --create-home streamchaos
USER 10001
ENTRYPOINT ["streamchaos"]
