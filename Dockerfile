# gpusched service image: one image, every service (`gpusched service NAME`).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Copy only what the package needs (keeps .venv, caches and .git out of the image).
COPY pyproject.toml README.md ./
COPY contracts ./contracts
COPY libs ./libs
COPY services ./services
RUN pip install .

# Policy and cluster files live outside the package; point the services at them explicitly.
COPY infra/config ./infra/config
ENV GPUSCHED_POLICY=/app/infra/config/demo.toml \
    GPUSCHED_CLUSTER=/app/infra/config/demo-cluster.csv \
    GPUSCHED_HTTP_HOST=0.0.0.0

RUN useradd --system --uid 10001 --no-create-home gpusched
USER gpusched

EXPOSE 8080 8081 8082 8083 8084 8085

ENTRYPOINT ["gpusched"]
CMD ["--help"]
