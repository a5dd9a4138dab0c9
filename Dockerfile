# The image the Docker work pool runs discovery flows in (prefect.yaml: ttt-discover:latest): the
# project and its locked dependencies at /opt/ttt-discover. Evaluator images are in images/.
#   docker build -t ttt-discover:latest .
# Not built in this project's CI (it pulls a public base and the CUDA torch wheels, several GB).
ARG BASE=python:3.11-slim
FROM ${BASE}
ENV UV_PROJECT_ENVIRONMENT=/opt/ttt-discover/.venv UV_LINK_MODE=copy PATH=/opt/ttt-discover/.venv/bin:$PATH
WORKDIR /opt/ttt-discover
RUN python3 -m pip install --no-cache-dir uv==0.13.9
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --frozen --no-install-project
COPY cli ./cli
COPY discover ./discover
COPY evaluators ./evaluators
COPY storage ./storage
COPY flows ./flows
COPY configs ./configs
COPY prefect.yaml ./
RUN uv sync --frozen
