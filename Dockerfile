# syntax=docker/dockerfile:1
# The agentrun operator image: the distribution agentrun-k8s with its extra otel. The Helm chart and
# manifests/ run `python -m agentrun.operator` in it
# (and `python -m agentrun.deploy.selftest` for `helm test`).
#   docker build -t agentrun/operator:0.1.0 .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
RUN python -m venv /opt/agentrun && /opt/agentrun/bin/pip install '.[otel]'

FROM ${PYTHON_IMAGE}
COPY --from=build /opt/agentrun /opt/agentrun
# read-only root filesystem: no bytecode writes; logs unbuffered
ENV PATH=/opt/agentrun/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# numeric, so that runAsNonRoot can verify it
USER 65532:65532
CMD ["python", "-m", "agentrun.operator"]
