FROM python:3.11-slim
WORKDIR /app
# The packages, and the links saga_shared -> shared and saga_services -> services that give
# them their installed names (.dockerignore leaves the rest out).
COPY . .
RUN pip install --no-cache-dir ".[server]" && useradd --system saga
USER saga
# Every process serves /metrics (SAGA_METRICS_BIND, 0.0.0.0:9464 in docker-compose.yml) with its
# event loop's heartbeat; one whose endpoint does not answer, or whose loop has not beaten for
# 30 s, is unhealthy. The one-shot setup has none to probe.
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-m", "saga_app.health"]
ENTRYPOINT ["saga"]
CMD ["run", "all"]
