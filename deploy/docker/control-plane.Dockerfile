# syntax=docker/dockerfile:1.7
# The control plane: one image, three commands (the chart picks one per workload).
#   scheduler   prewarm scheduler run     (the default CMD; hint API and /healthz on 8080)
#   ingest      prewarm ingest run        (set HEALTHCHECK_URL to its /metrics server, e.g. :9100/healthz)
#   retrain     prewarm forecast train    (a run-to-completion job: no health check needed)
# Build from the repository root:
#   docker build -f deploy/docker/control-plane.Dockerfile -t prewarm-control .
# Installs exactly what uv.lock says (uv sync --frozen): the base dependencies plus the `control` extra,
# no dev group. Runs as uid 10001, never root.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.13.8

FROM ${UV_IMAGE} AS uv

FROM ${PYTHON_IMAGE} AS build
COPY --from=uv /uv /usr/local/bin/uv
# Bytecode compiled at build time (a read-only root filesystem cannot take .pyc files later); copy, not
# hard-link, from the cache mount, which is gone after the build.
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/opt/prewarm/venv
WORKDIR /src
# The dependencies first, in their own layer: it is rebuilt only when the lock changes.
COPY pyproject.toml uv.lock README.md ./
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --extra control --no-install-project
COPY prewarm ./prewarm
COPY models ./models
COPY ingest ./ingest
COPY forecaster ./forecaster
COPY scheduler ./scheduler
COPY executor ./executor
COPY sim ./sim
COPY prewarm_cli ./prewarm_cli
COPY prewarm_client ./prewarm_client
# --no-editable: the project goes into the venv as a wheel, so the runtime stage needs no source tree.
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --extra control --no-editable

FROM ${PYTHON_IMAGE} AS runtime
ARG PREWARM_UID=10001
RUN groupadd --system --gid "${PREWARM_UID}" prewarm \
    && useradd --system --uid "${PREWARM_UID}" --gid prewarm --home-dir /var/lib/prewarm --create-home \
       --shell /usr/sbin/nologin prewarm
COPY --from=build /opt/prewarm/venv /opt/prewarm/venv
COPY deploy/docker/healthcheck.py /opt/prewarm/healthcheck.py
ENV PATH=/opt/prewarm/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PREWARM_DATA_DIR=/var/lib/prewarm \
    PREWARM_API_HOST=0.0.0.0 \
    HEALTHCHECK_URL=http://127.0.0.1:8080/healthz
WORKDIR /var/lib/prewarm
USER ${PREWARM_UID}:${PREWARM_UID}
EXPOSE 8080 9100
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "/opt/prewarm/healthcheck.py"]
ENTRYPOINT ["prewarm"]
CMD ["scheduler", "run"]
