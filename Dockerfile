# One image for every agentrun process: `agentrun worker` (default), `agentrun operator`, `agentrun migrate`.
# Build: docker build -t agentrun:0.1.0 .
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

# -- builder: install the package and its dependencies into a virtualenv (all from wheels).
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/agentrun
WORKDIR /src
COPY pyproject.toml README.md ./
COPY worker/ worker/
COPY operator/ operator/
# The versions the suite was last green with (`make upgrade` renews them), as constraints: the image runs what
# was tested, while the package's own ranges stay open for those who install it into their environment.
COPY requirements/dev.txt requirements/dev.txt
# Every model provider's SDK (Bedrock, Vertex, OpenAI-compatible): the image serves whichever a run names.
# The final stage installs nothing, so the virtualenv loses its installer.
# With the `providers` extra (Bedrock, Vertex AI, OpenAI-compatible) and the `otel` one (traces over
# OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT is set, off otherwise).
RUN /opt/agentrun/bin/pip install -c requirements/dev.txt ".[providers,otel]" \
    && /opt/agentrun/bin/pip uninstall --yes pip

# -- final: the virtualenv on the same slim base, run as an unprivileged user with a numeric UID
# (so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd).
FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 agentrun \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin agentrun
COPY --from=builder /opt/agentrun /opt/agentrun
# Bytecode is compiled at install; a read-only root filesystem could not take new .pyc files anyway.
ENV PATH=/opt/agentrun/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    AGENTRUN_LOG_FORMAT=json
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["agentrun"]
CMD ["worker"]
