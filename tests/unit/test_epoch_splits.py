"""The parallelism `bridge produce` splits each epoch for comes from the settings alone, never
from the executors registered when Spark plans the epoch (which a replay does before they are)."""

from __future__ import annotations

import os

import pytest

from bridge_shell.spark.epoch_splits import settled_parallelism


@pytest.mark.parametrize(
    ("conf", "master", "expected"),
    [
        ({}, "local[2,4]", 2),
        ({}, "local[3]", 3),
        ({}, "local", 1),
        ({}, "local[*]", os.cpu_count() or 1),
        # Set, it wins wherever the executors run.
        ({"spark.default.parallelism": "12"}, "local[2]", 12),
        ({"spark.default.parallelism": "12", "spark.cores.max": "4"}, "spark://m:7077", 12),
        # A cluster: the cores the application may take, else its executors', else Spark's floor.
        ({"spark.cores.max": "16"}, "spark://m:7077", 16),
        ({"spark.executor.instances": "3", "spark.executor.cores": "4"}, "k8s://h:443", 12),
        ({"spark.executor.instances": "3"}, "k8s://h:443", 2),
        ({}, "spark://m:7077", 2),
        ({}, "yarn", 2),
        # A local master's threads, not a cluster's cores setting.
        ({"spark.cores.max": "16"}, "local[2]", 2),
        # Nonsense is not a count: the next rule decides.
        ({"spark.default.parallelism": "0", "spark.cores.max": "x"}, "spark://m:7077", 2),
    ],
)
def test_the_parallelism_comes_from_the_settings(
    conf: dict[str, str], master: str, expected: int
) -> None:
    assert settled_parallelism(conf, master) == expected
