# syntax=docker/dockerfile:1
# recoveryd's container image: the wheel built in one stage, installed into a virtual
# environment on a slim Python in the next. Runs as a fixed non-root user with a
# read-only root filesystem: all state is on the /var/lib/recoveryd volume.
# tests/deploy/test_image.py lints this file and runs these steps and this ENV without
# Docker; docs/operating.md#container-image describes the image.

# The base image: a full version, so a rebuild gets the same Python, and its digest, so a
# rebuild gets the same bytes. The digest cannot be looked up where this file is edited
# (no registry): a release sets it here, from `docker buildx imagetools inspect
# "$PYTHON_IMAGE"` (CONTRIBUTING.md, Releasing), or passes --build-arg PYTHON_DIGEST=.
# Left empty, the build takes what the tag names that day.
# Its Python is the newest the suite passes on, which CI runs it on beside the oldest
# (.ci/run): of the two tested on every change, the one with security fixes the longer
# (to October 2029, 3.11's end in October 2027) and the faster, so the image moves only
# to new patch releases for years. tests/deploy/test_pythons.py keeps it the newest.
ARG PYTHON_IMAGE=python:3.13.9-slim-bookworm
ARG PYTHON_DIGEST=
FROM ${PYTHON_IMAGE}${PYTHON_DIGEST:+@}${PYTHON_DIGEST} AS base

FROM base AS build
WORKDIR /src
# What the wheel is built from (pyproject.toml reads README.md and LICENSE), and no more:
# .dockerignore keeps caches out of daemon/.
COPY pyproject.toml README.md LICENSE ./
COPY daemon/ daemon/
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .
# The dependencies' exact versions and hashes (CONTRIBUTING.md says how it is made), beside
# the wheel for the next stage.
COPY requirements.lock /wheels/

FROM base
ARG SOURCE_URL
LABEL org.opencontainers.image.title="recoveryd" \
      org.opencontainers.image.description="Recovery daemon for an HTTP message delivery service: failure callbacks in, resumed workflows out." \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="${SOURCE_URL}"

# A fixed numeric user, so a pod's runAsUser/fsGroup and the volume's owner are known
# without reading /etc/passwd. Its home is the volume; nothing writes there but the
# daemon.
RUN groupadd --system --gid 10001 recoveryd \
    && useradd --system --no-log-init --uid 10001 --gid 10001 \
        --home-dir /var/lib/recoveryd --no-create-home --shell /usr/sbin/nologin recoveryd \
    && install -d -o 10001 -g 10001 -m 0700 /var/lib/recoveryd

# The virtual environment holds recoveryd and its dependencies, nothing else (not even
# pip: the base image's pip installs into it). The dependencies come from the lock, each
# file checked against its hash, wheels only (nothing is built from source here); then
# recoveryd with --no-deps, so nothing outside the lock is installed, and pip check fails
# the build if the lock no longer satisfies pyproject.toml. pip compiles every module as
# it installs, so the running daemon never needs to write a .pyc. The wheel and the lock
# are mounted from the build stage, not copied: they stay out of the image's layers.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m venv --without-pip /opt/recoveryd \
    && python -m pip --python /opt/recoveryd/bin/python install --no-cache-dir \
        --require-hashes --only-binary=:all: --requirement /wheels/requirements.lock \
    && python -m pip --python /opt/recoveryd/bin/python install --no-cache-dir --no-deps \
        /wheels/recoveryd-*.whl \
    && python -m pip --python /opt/recoveryd/bin/python check

# The container's defaults; the Helm chart sets the rest (the service URL, the token
# and signing keys from Secrets, RECOVERYD_CREDENTIALS_FILE on the volume). The admin
# listener stays on loopback, as the daemon's own default: it can rotate the token and
# redrive work, so opening it to the network is a choice made with RECOVERYD_ADMIN_TOKEN
# (the chart listens on 0.0.0.0:9090 for Prometheus, with a token and a NetworkPolicy).
# `docker exec ... recoveryd removals` still reaches it.
# TMPDIR is the volume, the one writable place (SQLite's and Python's temporary files).
ENV PATH="/opt/recoveryd/bin:$PATH" \
    RECOVERYD_STORE="sqlite:////var/lib/recoveryd/recoveryd.db" \
    RECOVERYD_RULES="/etc/recoveryd/rules.yaml" \
    RECOVERYD_LISTEN="0.0.0.0:8080" \
    RECOVERYD_ADMIN_LISTEN="127.0.0.1:9090" \
    TMPDIR="/var/lib/recoveryd" \
    PYTHONDONTWRITEBYTECODE="1" \
    PYTHONUNBUFFERED="1"

VOLUME ["/var/lib/recoveryd"]
USER 10001:10001
EXPOSE 8080 9090
# No WORKDIR: the working directory stays `/`, read-only. Every path above is absolute,
# and the test checks that serve writes nothing to its working directory. The rules file
# is not in the image: mount it at /etc/recoveryd/rules.yaml (the chart's ConfigMap).
# No HEALTHCHECK: Kubernetes probes /healthz and /readyz on port 8080.
ENTRYPOINT ["recoveryd"]
CMD ["serve"]
