# Spark's Kafka connector and spark-avro (spark_jobs/jars/pom.xml), resolved from Maven Central
# when the image is built: a pod usually cannot reach a Maven repository, and the image has no
# Maven. The command is bridge_shell/maven.py's own; tests/integration/test_kubernetes_manifests.py
# runs this stage's RUN line, then the producer's command with these jars and no Maven.
FROM maven:3.9-eclipse-temurin-17 AS jars
COPY spark_jobs/jars/pom.xml /jars/pom.xml
RUN mvn -B -q -f /jars/pom.xml dependency:copy-dependencies -DoutputDirectory=/jars/spark-kafka -DincludeScope=runtime && touch /jars/spark-kafka/.complete

# One image for both halves of the pipeline: the Spark producer job needs a JVM, the consumer not.
# Debian 12 (bookworm) is pinned because it ships Java 17, which Spark 4 runs on; its python
# images exist for amd64 and arm64, and so does its JRE package.
FROM python:3.11-slim-bookworm

# The JRE's directory is named after the architecture; the link gives both one name.
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless curl tini \
    && rm -rf /var/lib/apt/lists/* \
    && ln -s "/usr/lib/jvm/java-17-openjdk-$(dpkg --print-architecture)" /usr/lib/jvm/java-17

ENV JAVA_HOME=/usr/lib/jvm/java-17 \
    PYSPARK_PYTHON=/usr/local/bin/python \
    PYTHONUNBUFFERED=1

WORKDIR /app
COPY pyproject.toml setup.py README.md ./
COPY bridge ./bridge
COPY bridge_shell ./bridge_shell
COPY spark_jobs ./spark_jobs
COPY consumers ./consumers
# The consumer's Avro reader is C (consumers/decoding/_avro_body.c): a compiler for the install, gone after.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install --no-cache-dir . \
    && apt-get purge -y --auto-remove gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

# The jars the producer's commands need (`produce --source=kafka`, typed columns): nothing is
# fetched at run time.
COPY --from=jars /jars/spark-kafka /opt/bridge/jars/spark-kafka
ENV BRIDGE_SPARK_KAFKA_JARS=/opt/bridge/jars/spark-kafka

# Spark's Python processes import a compiled PySpark (bridge_shell/spark/spark_home.py); it is
# built here, once, in a cache the unprivileged user owns: the driver packs the executors'
# environment there beside it, and executor pods (`bridge executor`) run from it.
ENV XDG_CACHE_HOME=/opt/cache
RUN python -c "from bridge_shell.spark.spark_home import precompiled_spark_home; precompiled_spark_home()" \
    && chown -R 1000:1000 /opt/cache

# /data holds the producer's input and checkpoint. A named volume mounted there starts as a
# copy of this directory, ownership included, so the unprivileged user can write it.
RUN mkdir -p /data/input /data/checkpoint && chown -R 1000:1000 /data
USER 1000:1000
# `bridge <command>`; Spark's Kubernetes scheduler starts executor pods of this image with the
# argument `executor`, which `bridge executor` runs (bridge_shell/spark/pod_executor.py).
ENTRYPOINT ["bridge"]
