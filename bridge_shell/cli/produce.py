"""`bridge produce`: the Spark producer job (also runnable with spark-submit)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from bridge import logs
from bridge.names import DEFAULT_STACK_DIR
from bridge.settings import load_settings, stack_env_files
from bridge_shell.cli.options import ConfigFile, StackDir


def produce(
    topic: Annotated[str, typer.Option("--topic", help="The Kafka topic to write.")],
    checkpoint: Annotated[
        str,
        typer.Option(
            "--checkpoint",
            help="Spark's checkpoint directory for this query: a local path or a Hadoop URI "
            "(hdfs://, s3a://, ...); on a cluster, one that the driver can reach after a restart.",
        ),
    ],
    source: Annotated[
        str, typer.Option("--source", help="files (JSON lines), rate, or kafka.")
    ] = "files",
    input_dir: Annotated[
        str | None,
        typer.Option(
            "--input",
            help="The directory of the files source: a local path or a Hadoop URI; on a "
            "cluster, one every executor can read.",
        ),
    ] = None,
    source_topic: Annotated[
        str | None, typer.Option("--source-topic", help="The topic of the kafka source.")
    ] = None,
    rows_per_second: Annotated[
        int, typer.Option("--rows-per-second", help="The rate source's speed.")
    ] = 1000,
    key_field: Annotated[
        str | None, typer.Option("--key-field", help="The field that becomes the record key.")
    ] = None,
    trigger: Annotated[
        str, typer.Option("--trigger", help="available-now, or an interval such as '10 seconds'.")
    ] = "available-now",
    max_files_per_trigger: Annotated[
        int | None, typer.Option("--max-files-per-trigger", help="Files per epoch (files source).")
    ] = None,
    transactional_id_prefix: Annotated[
        str | None,
        typer.Option(
            "--transactional-id-prefix",
            help="Unique per query and stable across its restarts; default: from the query id.",
        ),
    ] = None,
    transactional_id_naming: Annotated[
        str | None,
        typer.Option(
            "--transactional-id-naming",
            help="pooled (the default: two ids per partition, taken in turn by its epochs), "
            "per-epoch (one id per partition and epoch) or per-partition (one id per "
            "partition); see docs/capacity.md.",
        ),
    ] = None,
    epochs: Annotated[
        str | None,
        typer.Option(
            "--epochs",
            help="whole (the default: also write the epoch manifest, which tells a reader "
            "when each epoch is whole) or per-partition (docs/sink.md).",
        ),
    ] = None,
    transaction_timeout_ms: Annotated[
        int | None,
        typer.Option(
            "--transaction-timeout-ms",
            help="Above the longest write task, within the broker's transaction.max.timeout.ms.",
        ),
    ] = None,
    bootstrap_servers: Annotated[
        str | None,
        typer.Option("--bootstrap-servers", help="Default: the settings, then stack.env."),
    ] = None,
    master: Annotated[
        str | None,
        typer.Option(
            "--master",
            help="Spark master: local[N], spark://host:port, yarn, k8s://...; default: the "
            "settings' spark.master (stack.env has the stack's), then local[2,4].",
        ),
    ] = None,
    executor_python: Annotated[
        str | None,
        typer.Option(
            "--executor-python",
            help="On a cluster: the Python the executors run (default: spark.executor_python, "
            "then the interpreter this one was made from).",
        ),
    ] = None,
    progress_file: Annotated[
        Path | None,
        typer.Option(
            "--progress-file",
            help="The sink's per-epoch counters on the driver's machine; default: in a local "
            "checkpoint, else under ~/.local/state/bridge/progress/.",
        ),
    ] = None,
    spark_conf: Annotated[
        list[str] | None,
        typer.Option("--spark-conf", help="KEY=VALUE for the Spark session; repeatable."),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            help="Serve Prometheus /metrics from the driver on this port (0: any free one).",
        ),
    ] = None,
    value_format: Annotated[
        str,
        typer.Option(
            "--value-format",
            help="json (each line, or the row as JSON), avro, json-schema or protobuf (typed "
            "records registered in the schema registry of the settings, schema_registry.url; "
            "see docs/typed-records.md).",
        ),
    ] = "json",
    key_format: Annotated[
        str,
        typer.Option(
            "--key-format",
            help="json (the --key-field's value as text) or avro, json-schema or protobuf: a "
            "typed record of the --key-field, registered under the topic's -key subject.",
        ),
    ] = "json",
    value_schema: Annotated[
        str | None,
        typer.Option(
            "--value-schema",
            help="With a registry format and the files or kafka source: the lines' fields as "
            "Spark DDL, e.g. "
            "'id BIGINT, amount DECIMAL(12,2), at TIMESTAMP'.",
        ),
    ] = None,
    config: ConfigFile = None,
    stack_dir: StackDir = Path(DEFAULT_STACK_DIR),
) -> None:
    """Run a Spark streaming query into Kafka, one transaction per partition and epoch."""
    from bridge.errors import ConfigError
    from bridge_shell.maven import spark_kafka_jars
    from bridge_shell.spark.locations import spark_location
    from bridge_shell.spark.producer_job import ProducerJob, Source, run
    from bridge_shell.spark.spark_session import started_by_spark_submit

    logs.configure()
    overrides = {"kafka": {"bootstrap_servers": bootstrap_servers}} if bootstrap_servers else {}
    settings = load_settings(config, env_file=stack_env_files(stack_dir, "producer"), **overrides)
    try:
        chosen = Source(source)
    except ValueError:
        raise ConfigError([("--source", f"{source!r} is not one of files, rate, kafka")]) from None
    job = ProducerJob(
        source=chosen,
        topic=topic,
        checkpoint=spark_location(checkpoint),
        bootstrap_servers=settings.kafka.bootstrap_servers,
        kafka_properties={k: str(v) for k, v in settings.kafka.properties.items()},
        input=spark_location(input_dir) if input_dir else None,
        source_topic=source_topic,
        rows_per_second=rows_per_second,
        key_field=key_field,
        trigger=trigger,
        max_files_per_trigger=max_files_per_trigger,
        transactional_id_prefix=transactional_id_prefix,
        transactional_id_naming=transactional_id_naming,
        epochs=epochs,
        transaction_timeout_ms=transaction_timeout_ms,
        # Under spark-submit its own --master rules, not the one stack.env names.
        master=master or (None if started_by_spark_submit() else settings.spark.master),
        executor_python=executor_python or settings.spark.executor_python,
        progress_file=progress_file.resolve() if progress_file else None,
        spark_conf=_key_values(spark_conf or []),
        # Spark's Kafka connector for the kafka source; its Avro functions for typed values.
        jars=tuple(spark_kafka_jars())
        if chosen is Source.KAFKA or value_format != "json" or key_format != "json"
        else (),
        metrics_port=metrics_port,
        value_format=value_format,
        key_format=key_format,
        value_schema=value_schema,
        registry=settings.schema_registry.client_config() if settings.schema_registry else {},
    )
    counters = run(job)
    Console(soft_wrap=True).print(
        f"produced {counters.rows_written} rows in {counters.epochs_committed} epochs "
        f"({counters.partitions_skipped} partition-epochs skipped as already committed)"
    )


def executor_env(
    output: Annotated[
        Path,
        typer.Option(
            "--output",
            help="Writes OUTPUT.tar (for --archives) and OUTPUT/ (for the driver's own Python "
            "processes: run spark-submit where it is, named bridge-env).",
        ),
    ] = Path("bridge-env"),
    executor_python: Annotated[
        str | None,
        typer.Option("--executor-python", help="The Python the executors run."),
    ] = None,
) -> None:
    """Pack what a cluster's executors need to run the sink (our code, confluent-kafka, pyarrow,
    tenacity, python-json-logger) for a plain spark-submit, and print the options that ship it."""
    from bridge_shell.spark.executor_env import (
        ARCHIVE_ALIAS,
        default_executor_python,
        write_executor_env,
    )

    env = write_executor_env(output.resolve())
    conf = env.spark_conf(executor_python or default_executor_python())
    console = Console(soft_wrap=True)
    console.print(f"wrote {env.archive} and {env.directory}/", highlight=False)
    if env.directory.name != ARCHIVE_ALIAS:
        console.print(f"note: the driver finds it only as ./{ARCHIVE_ALIAS}/ in its working "
                      "directory", highlight=False)  # fmt: skip
    console.print("spark-submit options:", highlight=False)
    options = [f"--archives {conf['spark.archives']}"]
    options += [f"--conf {key}={conf[key]}" for key in sorted(conf) if key != "spark.archives"]
    console.print(" ".join(options), highlight=False)


def executor() -> None:
    """An executor pod's command, which Spark's Kubernetes scheduler runs in each executor pod
    of the image (its one argument `executor`, its settings in the environment): the executor's
    JVM, from the image's prepared Spark home (docs/deploy.md, "Kubernetes")."""
    from bridge.errors import StackError
    from bridge_shell.spark.pod_executor import run_executor
    from bridge_shell.spark.spark_home import installed_spark_home, precompiled_spark_home

    home = precompiled_spark_home() or installed_spark_home()
    if home is None:
        raise StackError("PySpark with its Spark home (jars/) is not installed")
    run_executor(home)


def _key_values(pairs: list[str]) -> dict[str, str]:
    from bridge.errors import ConfigError

    bad = [pair for pair in pairs if "=" not in pair or not pair.split("=", 1)[0].strip()]
    if bad:
        raise ConfigError([("--spark-conf", f"{pair!r} is not KEY=VALUE") for pair in bad])
    return dict(pair.split("=", 1) for pair in pairs)
