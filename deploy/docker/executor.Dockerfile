# syntax=docker/dockerfile:1.7
# The GPU-node executor on a CUDA base: `prewarm executor run` (load API and /healthz on 8081, the
# hand-off socket for engines under PREWARM_SOCKET_DIR). Build from the repository root:
#   docker build -f deploy/docker/executor.Dockerfile -t prewarm-executor .
# Installs exactly what uv.lock says (uv sync --frozen) for the base dependencies only: torch,
# safetensors, boto3, kafka, pydantic... and none of the control plane's (pandas, statsmodels, MLflow),
# which a GPU node never loads. torch's CUDA libraries come with its wheels; the CUDA base brings the
# runtime that engines in the same node expect. Runs as uid 10001: engine pods that take weights over
# the hand-off socket must run as the same uid (the executor checks its peers' uid).
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-runtime-ubuntu24.04
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.13.8

FROM ${UV_IMAGE} AS uv

FROM ${CUDA_IMAGE} AS build
COPY --from=uv /uv /usr/local/bin/uv
# The CUDA base has no Python of the versions prewarm supports: uv installs a standalone CPython under
# /opt/python, copied as it is into the runtime stage (same path, so the venv's interpreter link holds).
ENV UV_PYTHON_INSTALL_DIR=/opt/python \
    UV_PYTHON_PREFERENCE=only-managed \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PROJECT_ENVIRONMENT=/opt/prewarm/venv
RUN uv python install 3.12
WORKDIR /src
COPY pyproject.toml uv.lock README.md ./
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --no-install-project --python 3.12
COPY prewarm ./prewarm
COPY models ./models
COPY ingest ./ingest
COPY forecaster ./forecaster
COPY scheduler ./scheduler
COPY executor ./executor
COPY sim ./sim
COPY prewarm_cli ./prewarm_cli
COPY prewarm_client ./prewarm_client
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --no-editable --python 3.12

FROM ${CUDA_IMAGE} AS runtime
ARG PREWARM_UID=10001
RUN groupadd --system --gid "${PREWARM_UID}" prewarm \
    && useradd --system --uid "${PREWARM_UID}" --gid prewarm --home-dir /var/lib/prewarm --create-home \
       --shell /usr/sbin/nologin prewarm
COPY --from=build /opt/python /opt/python
COPY --from=build /opt/prewarm/venv /opt/prewarm/venv
COPY deploy/docker/healthcheck.py /opt/prewarm/healthcheck.py
ENV PATH=/opt/prewarm/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PREWARM_DATA_DIR=/var/lib/prewarm \
    PREWARM_DEVICE=cuda \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    HEALTHCHECK_URL=http://127.0.0.1:8081/healthz
WORKDIR /var/lib/prewarm
USER ${PREWARM_UID}:${PREWARM_UID}
EXPOSE 8081
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "/opt/prewarm/healthcheck.py"]
ENTRYPOINT ["prewarm"]
CMD ["executor", "run"]
