# Multi-stage: build the wheels with the compilers' image, run on a slim one as a
# non-root user. The stack in docker-compose.yml uses this image for every Cellsight
# service (init, sync, indexer, outbox relay, API).
FROM python:3.11-slim AS build
WORKDIR /src
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY pyproject.toml README.md ./
COPY cellsight cellsight
COPY notifications notifications
COPY cells cells
COPY indexer indexer
COPY api api
COPY query query
RUN pip install --no-cache-dir '.[production]'

FROM python:3.11-slim
RUN useradd --system --uid 10001 --home-dir /var/lib/cellsight --create-home cellsight
COPY --from=build /opt/venv /opt/venv
COPY deploy/init-cells.sh /opt/cellsight/deploy/init-cells.sh
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    CELLSIGHT_DATA_DIR=/var/lib/cellsight
USER cellsight
WORKDIR /var/lib/cellsight
EXPOSE 8774 9100
CMD ["cellsight", "--help"]
