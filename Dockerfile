# One image for both halves of the pipeline: the Spark producer job needs a JVM, the consumer not.
FROM python:3.11-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless curl \
    && rm -rf /var/lib/apt/lists/*

ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64 \
    PYSPARK_PYTHON=/usr/local/bin/python \
    PYTHONUNBUFFERED=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY bridge ./bridge
COPY spark_jobs ./spark_jobs
COPY consumers ./consumers
RUN pip install --no-cache-dir .

USER 1000:1000
ENTRYPOINT ["bridge"]
