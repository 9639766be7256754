# zerotune service image: `docker build -t zerotune .` then `docker run -p 8000:8000 zerotune`
# (SQLite in the /data volume, one embedded worker). compose.yaml runs it with PostgreSQL and workers.
#
# CPU torch by default. For a CUDA build pick the wheel index of your CUDA version, e.g.
#   docker build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126 -t zerotune:cuda .
ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim

ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    ZEROTUNE_DATA_DIR=/data \
    ZEROTUNE_HOST=0.0.0.0 \
    ZEROTUNE_PORT=8000

RUN groupadd --system --gid 10001 zerotune \
    && useradd --system --uid 10001 --gid zerotune --home-dir /app --no-create-home --shell /usr/sbin/nologin zerotune

WORKDIR /app

# torch first, in its own layer: it is the big one, and the zerotune install below keeps it.
# TORCH_SPEC pins it; hadolint cannot see the version through the build argument:
# hadolint ignore=DL3013
RUN pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" "${TORCH_SPEC}"

COPY pyproject.toml README.md ./
COPY zerotune ./zerotune
RUN pip install --no-cache-dir . \
    && mkdir -p /data \
    && chown 10001:10001 /data

USER 10001:10001
VOLUME ["/data"]
EXPOSE 8000

HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 CMD ["zerotune", "health"]

ENTRYPOINT ["zerotune"]
CMD ["serve"]
