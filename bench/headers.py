"""What the sink's provenance headers cost a producing thread, outside Spark, and a reader.

    .venv/bin/python -m bench.headers [--records 50000] [--rounds 7] [--value-bytes 100]
        [--read-records 200000]

Every record the sink writes carries three headers (`bridge.query`, `bridge.partition`,
`bridge.epoch`), one object shared by all the records of a task. This produces `--records`
records of `--value-bytes` bytes in one Kafka transaction, as one write task does, with no
header, with one, and with the three (as a dict and as a list of pairs: the sink uses either),
in alternated rounds, and reports the median of each: the produce calls' time on the Python
thread (the loop the sink runs), the commit's, and the process's CPU over the whole
transaction (librdkafka's threads included). One more shape is the sink's with whole epochs:
the three headers, and every record's delivery report gathered into offset ranges
(`bridge.delivered_offsets`), waited for before the commit as the task waits before its part.

The reader's side: `--read-records` records with the three headers and as many without, each
written in one transaction, are read back (read_committed) once a round, fresh, and the
reading timed, µs a record: the first `Message.headers()` of each record (confluent-kafka
turns them into Python objects then), and `consumers.epochs.staging.runs`, which whole epochs
run over every record of a whole route to find its epoch. The collector is paused while
timing, as the consumer keeps it off the per-record path (consumers/run.py). Writes
bench/results/headers-*.json.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
import uuid
from collections.abc import Callable
from statistics import median
from typing import Any

from confluent_kafka import Consumer, Message, Producer

from bench.common import Endpoints, new_topic, running_stack, write_results
from bench.cpu import process_seconds
from bridge.delivered_offsets import DeliveredOffsets
from consumers.epochs.staging import runs as epoch_runs

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
    "three + offsets": list(PROVENANCE.items()),
}
GATHERS_OFFSETS = {"three + offsets"}


def one_transaction(
    stack: Endpoints, topic: str, values: list[bytes], headers: Any, *, offsets: bool = False
) -> dict[str, float]:
    """One task's worth of records in one transaction; what each part took. With `offsets`,
    their delivery reports gathered, and waited for before the commit."""
    delivered = DeliveredOffsets()
    config: dict[str, Any] = {"bootstrap.servers": stack.bootstrap_servers, "linger.ms": 5,
                              "transactional.id": f"bench-headers-{uuid.uuid4().hex}"}  # fmt: skip
    if offsets:
        config["on_delivery"] = delivered
    producer = Producer(config)
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
    if offsets:
        producer.flush(60)
        if delivered.ranges({topic: len(values)}) is None:
            raise RuntimeError(f"{topic}: the delivery reports do not name every record")
    producer.commit_transaction(60)
    committed = time.perf_counter()
    cpu = process_seconds(os.getpid()) - cpu_before
    return {
        "produce_ms": (produced - started) * 1000,
        "commit_ms": (committed - produced) * 1000,
        "cpu_ms": cpu * 1000,
    }


def read_back(stack: Endpoints, topic: str, count: int) -> list[Message]:
    """Every record of `topic`, read as the consumer reads them."""
    consumer = Consumer({"bootstrap.servers": stack.bootstrap_servers,
                         "group.id": f"bench-headers-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})  # fmt: skip
    consumer.subscribe([topic])
    found: list[Message] = []
    deadline = time.monotonic() + 120
    while len(found) < count and time.monotonic() < deadline:
        found += [m for m in consumer.consume(10_000, 1.0) if m.error() is None]
    consumer.close()
    if len(found) != count:
        raise RuntimeError(f"{topic}: read {len(found)} records of {count}")
    return found


def reading(stack: Endpoints, topic: str, count: int) -> dict[str, float]:
    """µs a record: the first headers() of each, and `runs` over them, on fresh records."""
    timed: dict[str, float] = {}
    for name, work in (("headers_us", lambda ms: [m.headers() for m in ms]),
                       ("runs_us", lambda ms: sum(1 for _ in epoch_runs(ms)))):  # fmt: skip
        records = read_back(stack, topic, count)
        gc.collect()
        gc.disable()
        try:
            started = time.perf_counter()
            work(records)
            timed[name] = (time.perf_counter() - started) * 1e6 / count
        finally:
            gc.enable()
    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--read-records", type=int, default=200_000)
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
                runs[shape].append(one_transaction(stack, topic, values, SHAPES[shape],
                                                   offsets=shape in GATHERS_OFFSETS))  # fmt: skip
        read_values = values * (args.read_records // len(values) + 1)
        read_topics = {}
        for shape in ("none", "three (list)"):
            read_topics[shape] = f"bench-headers-read-{uuid.uuid4().hex[:8]}"
            new_topic(stack, read_topics[shape], partitions=1)
            one_transaction(stack, read_topics[shape], read_values[: args.read_records],
                            SHAPES[shape])  # fmt: skip
        reads: dict[str, list[dict[str, float]]] = {shape: [] for shape in read_topics}
        for number in range(args.rounds):
            for shape in list(read_topics)[:: 1 if number % 2 == 0 else -1]:
                reads[shape].append(reading(stack, read_topics[shape], args.read_records))
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
    with_offsets = figures["three + offsets"]
    offsets_cpu_us = (
        (with_offsets["cpu_ms"] - figures["three (list)"]["cpu_ms"]) * 1000 / args.records
    )
    print(f"gathering the offsets adds {offsets_cpu_us:.2f} µs of process CPU a record")
    read_figures = {
        shape: {part: round(median(r[part] for r in done), 3) for part in done[0]}
        for shape, done in reads.items()
    }
    for shape, f in read_figures.items():
        print(f"  reading {args.read_records:,} records with headers {shape}: first headers() "
              f"{f['headers_us']} µs a record, runs {f['runs_us']} µs a record")  # fmt: skip
    path = write_results("headers", {
        "records": args.records, "value_bytes": args.value_bytes, "rounds": args.rounds,
        "shapes": figures, "rounds_produce_ms": every_round,
        "three_headers_added_us_per_record": round(per_row_us, 2),
        "offsets_added_cpu_us_per_record": round(offsets_cpu_us, 2),
        "read_records": args.read_records, "reading": read_figures,
        "rounds_reading": {shape: [{k: round(v, 3) for k, v in r.items()} for r in done]
                           for shape, done in reads.items()},
    })  # fmt: skip
    print(f"figures: {path}")


if __name__ == "__main__":
    main()
