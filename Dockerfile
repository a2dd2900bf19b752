# One image for every role: `membership arbiter ...`, `membership node ...`,
# `membership watch ...`, `membership view ...`. docker-compose.yml runs a demo
# cluster from it; README.md, "Docker", shows how to use it.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

# The package and its runtime dependencies only (no test or bench extras);
# the sources are not kept in the image.
COPY pyproject.toml README.md /src/
COPY membership /src/membership
COPY arbiter /src/arbiter
RUN pip install --no-cache-dir /src && rm -rf /src

# A fixed uid, so files in volumes belong to the same user on every host.
# /data is where an arbiter replica keeps its Raft state (--data-dir /data),
# /certs where docker-compose.yml's `certs` service writes the TLS files:
# both are created owned by that user, and Docker gives a new named volume
# mounted there the same owner, so the process can write to it.
RUN useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin membership \
    && mkdir /data /certs \
    && chown membership:membership /data /certs
USER 10001:10001
WORKDIR /home/membership

# Arbiters listen here (--listen 0.0.0.0:7000); nodes and watchers listen nowhere.
EXPOSE 7000

# No HEALTHCHECK here: the image runs nodes and watchers too, which serve
# nothing to check. docker-compose.yml gives the arbiter services one.
ENTRYPOINT ["membership"]
CMD ["--help"]
