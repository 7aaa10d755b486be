"""What the sink's provenance headers cost a producing thread, outside Spark.

    .venv/bin/python -m bench.headers [--records 50000] [--rounds 7] [--value-bytes 100]

Every record the sink writes carries three headers (`bridge.query`, `bridge.partition`,
`bridge.epoch`), one object shared by all the records of a task. This produces `--records`
records of `--value-bytes` bytes in one Kafka transaction, as one write task does, with no
header, with one, and with the three (as a dict and as a list of pairs: the sink uses either),
in alternated rounds, and reports the median of each: the produce calls' time on the Python
thread (the loop the sink runs), the commit's, and the process's CPU over the whole
transaction (librdkafka's threads included). Writes bench/results/headers-*.json.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from collections.abc import Callable
from statistics import median
from typing import Any

from confluent_kafka import Producer

from bench.common import Endpoints, new_topic, running_stack, write_results
from bench.cpu import process_seconds

PROVENANCE = {
    "bridge.query": b"7a1c5b2e-2d3f-4c85-9a41-0f8e2b6c1d90",
    "bridge.partition": b"3",
    "bridge.epoch": b"812",
}
SHAPES: dict[str, Any] = {
    "none": None,
    "one": {"bridge.epoch": PROVENANCE["bridge.epoch"]},
    "three (dict)": PROVENANCE,
    "three (list)": list(PROVENANCE.items()),
}


def one_transaction(
    stack: Endpoints, topic: str, values: list[bytes], headers: Any
) -> dict[str, float]:
    """One task's worth of records in one transaction; what each part took."""
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers, "linger.ms": 5,
                         "transactional.id": f"bench-headers-{uuid.uuid4().hex}"})  # fmt: skip
    producer.init_transactions(30)
    produce: Callable[..., None] = producer.produce
    cpu_before = process_seconds(os.getpid())
    producer.begin_transaction()
    started = time.perf_counter()
    for value in values:
        while True:
            try:
                produce(topic, value, None, headers=headers)
                break
            except BufferError:
                producer.poll(0.01)
    produced = time.perf_counter()
    producer.commit_transaction(60)
    committed = time.perf_counter()
    cpu = process_seconds(os.getpid()) - cpu_before
    return {
        "produce_ms": (produced - started) * 1000,
        "commit_ms": (committed - produced) * 1000,
        "cpu_ms": cpu * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--value-bytes", type=int, default=100)
    args = parser.parse_args()
    values = [(f'{{"id": {i}, "note": "' + "x" * args.value_bytes)[: args.value_bytes - 2].encode()
              + b'"}' for i in range(args.records)]  # fmt: skip
    runs: dict[str, list[dict[str, float]]] = {shape: [] for shape in SHAPES}
    with running_stack() as stack:
        topic = f"bench-headers-{uuid.uuid4().hex[:8]}"
        new_topic(stack, topic, partitions=1)
        one_transaction(stack, topic, values, None)  # the first transactional producer warms up
        for number in range(args.rounds):
            shapes = list(SHAPES)
            shapes = shapes[number % len(shapes) :] + shapes[: number % len(shapes)]
            for shape in shapes:
                runs[shape].append(one_transaction(stack, topic, values, SHAPES[shape]))
    figures: dict[str, dict[str, float]] = {
        shape: {part: round(median(r[part] for r in done), 1) for part in done[0]}
        for shape, done in runs.items()
    }
    every_round = {shape: [round(r["produce_ms"], 1) for r in done] for shape, done in runs.items()}
    base = figures["none"]["produce_ms"]
    print(f"{args.records:,} records of {args.value_bytes} bytes in one transaction, "
          f"median of {args.rounds} alternated rounds:")  # fmt: skip
    for shape, f in figures.items():
        print(f"  headers {shape:<13} produce {f['produce_ms']:>7} ms "
              f"({f['produce_ms'] / base:.2f}x none), commit {f['commit_ms']} ms, "
              f"process CPU {f['cpu_ms']} ms")  # fmt: skip
    per_row_us = (figures["three (list)"]["produce_ms"] - base) * 1000 / args.records
    print(f"three headers add {per_row_us:.2f} µs a record on the producing thread")
    path = write_results("headers", {
        "records": args.records, "value_bytes": args.value_bytes, "rounds": args.rounds,
        "shapes": figures, "rounds_produce_ms": every_round,
        "three_headers_added_us_per_record": round(per_row_us, 2),
    })  # fmt: skip
    print(f"figures: {path}")


if __name__ == "__main__":
    main()
