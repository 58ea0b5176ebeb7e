# The streamchaos image the Kubernetes game-day manifests run (manifests/cronjob.yaml).
#   docker build -t streamchaos:latest .
# CPU PyTorch is pinned through .ci/constraints.txt; the builtin stack is not used in-cluster (the
# game-day targets a running vLLM), but the image installs the engine extra so every command works
# (`pip install .` alone is the light core: remote targets only, no torch).
FROM python:3.11-slim
WORKDIR /opt/streamchaos
COPY pyproject.toml README.md ./
COPY .ci/constraints.txt .ci/constraints.txt
COPY chaos chaos
COPY faults faults
COPY sla sla
RUN pip install --no-cache-dir --extra-index-url https://download.pytorch.org/whl/cpu -c .ci/constraints.txt '.[engine,k8s]' \
    && useradd --uid 10001 --create-home streamchaos
USER 10001
ENTRYPOINT ["streamchaos"]
