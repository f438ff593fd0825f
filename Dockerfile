FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY saga_coordinator ./saga_coordinator
COPY saga_app ./saga_app
COPY services ./services
RUN pip install --no-cache-dir . && useradd --system saga
USER saga
ENTRYPOINT ["saga"]
CMD ["run", "all"]
