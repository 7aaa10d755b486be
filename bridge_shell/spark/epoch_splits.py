"""The split of each epoch into Spark partitions, fixed by the settings alone.

A replay of an epoch skips the partitions whose markers say they are in Kafka and writes the
others (`spark_jobs.epoch_transaction`), so it is exactly once only if the epoch splits into the
same partitions every time it is planned. A Kafka source splits by its topic's partitions. A
file source sizes its splits from `spark.sql.files.minPartitionNum`, which defaults to the cores
registered when Spark plans the epoch, and the rate source takes its partition count
(`numPartitions`) from them too: a driver restarted on a cluster plans the epoch it replays
before its executors have registered, and can split it otherwise than the run that died (rows
written twice and others skipped). So `bridge produce` gives both a number from its settings.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

# Spark's floor for the default parallelism of a cluster with no executor registered yet.
_CLUSTER_FLOOR = 2
_LOCAL = re.compile(r"local(?:\[(\d+|\*)(?:,\d+)?\])?")
# Either of these set by the user already fixes the file source's split.
FILE_SPLIT_SETTINGS = ("spark.sql.files.minPartitionNum", "spark.sql.leafNodeDefaultParallelism")


def settled_parallelism(conf: Mapping[str, str], master: str) -> int:
    """The parallelism the epochs are split for, from the settings alone: what Spark's default
    parallelism is once every executor has registered, where the settings say it
    (`spark.default.parallelism`, a local master's threads, `spark.cores.max`, or executor
    instances times their cores), else Spark's own floor for a cluster."""
    if _positive(conf.get("spark.default.parallelism")):
        return int(conf["spark.default.parallelism"])
    local = _LOCAL.fullmatch(master)
    if local is not None:
        threads = local.group(1)
        if threads is None:
            return 1
        return (os.cpu_count() or 1) if threads == "*" else max(1, int(threads))
    if _positive(conf.get("spark.cores.max")):
        return int(conf["spark.cores.max"])
    instances, cores = conf.get("spark.executor.instances"), conf.get("spark.executor.cores")
    if _positive(instances) and _positive(cores):
        return int(str(instances)) * int(str(cores))
    return _CLUSTER_FLOOR


def _positive(value: str | None) -> bool:
    return value is not None and value.strip().isdigit() and int(value) > 0
