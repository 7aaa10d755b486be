"""Records fed to a topic at a steady rate, numbered 0, 1, ...: the upstream of a `bridge produce
--source kafka` query in a benchmark, in a process of its own as a user's upstream is.

    .venv/bin/python -m bench.feed --bootstrap-servers B --topic T [--rate 2000]

Each value is the record's number in decimal; its timestamp is the producer's (CreateTime),
which the query's rows carry as `timestamp` (and the number as `value`). Produced with
idempotence (in order, once) until SIGTERM, which flushes what is in flight and exits 0. The
pace is kept per 10 ms tick against the wall clock, so a late tick catches up.
"""

from __future__ import annotations

import argparse
import signal
import time

from confluent_kafka import Producer

_TICK_S = 0.01


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--rate", type=int, default=2000)
    args = parser.parse_args()
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    producer = Producer({
        "bootstrap.servers": args.bootstrap_servers, "enable.idempotence": True,
        "linger.ms": 5,
    })  # fmt: skip
    started, sent = time.monotonic(), 0
    while not stopping:
        due = int((time.monotonic() - started) * args.rate)
        for n in range(sent, due):
            while True:
                try:
                    producer.produce(args.topic, str(n).encode())
                    break
                except BufferError:  # the local queue is full: let it drain, then go on
                    producer.poll(0.1)
        sent = max(sent, due)
        producer.poll(0)
        time.sleep(_TICK_S)
    left = producer.flush(60)
    if left:
        raise SystemExit(f"{left} records not delivered in 60 s")


if __name__ == "__main__":
    main()
