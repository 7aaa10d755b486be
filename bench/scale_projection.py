"""What more members on hosts of their own would sustain, projected from per-record costs
measured here: a model, not a measurement, stated with every input.

    .venv/bin/python -m bench.scale_projection [--postgres-cores 16] [--wal-mb-per-second 500]
        [--results-dir DIR]

Inputs, each from a results file a benchmark here wrote:
- the member's CPU and PostgreSQL's per record, by mode (JSON, from the claim, one member
  holding every partition, whole epochs): `bench.epochs`, EPOCHS below;
- the typed formats' member CPU against JSON's in the same runs: `bench.typed`, TYPED below;
- PostgreSQL's WAL per record, offsets included: `bench.capacity` (c), CAPACITY below;
- with two queries and two members, each member's share of the work: `bench.query_owners`,
  its latest results.

The model: a member is one Python process whose main thread is the bound (one core each, on
hosts of their own), and its PostgreSQL backend (one per member) takes one core of the
primary, so a member sustains 1 / (the larger of the two CPU costs per record); the primary
sustains `--postgres-cores` over its CPU per record, and its WAL device `--wal-mb-per-second`
(an assumption: often 0.3-1 GB/s) over the WAL a record writes (an insert's, also for upserts,
which write more). Per-partition routes use min(members, partitions) members. Whole routes use
one member per unit of queries: the table assumes one query per 4 partitions, so min(members,
partitions / 4) members, and one query never more than one member. Prints the tables for
docs/capacity.md and writes bench/results/scale-projection-*.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.common import RESULTS, write_results

EPOCHS = RESULTS / "epochs-20261127T160344Z.json"  # 1,000,000 records, CPU per run
TYPED = {
    "avro": RESULTS / "typed-20261125T170757Z.json",
    "protobuf": RESULTS / "typed-20261127T135725Z.json",
}
CAPACITY = RESULTS / "capacity-20261129T011629Z.json"
OWNERS = RESULTS / "query-owners-latest.json"
PARTITIONS = (4, 16, 64)
MEMBERS = (2, 4, 16)
_PARTITIONS_PER_QUERY = 4


def _load(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def costs() -> dict[str, dict[str, float]]:
    """Microseconds of CPU per record: the member's and PostgreSQL's, by mode (JSON, whole)."""
    document = _load(EPOCHS)
    records = float(document["records"])
    found: dict[str, dict[str, float]] = {}
    for run in document["throughput_rounds"][0]:
        if run["epochs"] == "whole":
            found[run["mode"]] = {
                "member_us": round(run["cpu"]["service_cpu_s"] / records * 1e6, 3),
                "postgres_us": round(run["cpu"]["postgres_cpu_s"] / records * 1e6, 3),
            }
    return found


def format_ratios() -> dict[str, float]:
    """Each typed format's member CPU over JSON's, insert, medians of the same runs."""
    ratios = {"json": 1.0}
    for name, path in TYPED.items():
        typed: list[float] = []
        plain: list[float] = []
        for round_ in _load(path)["consumer"]["rounds"]:
            for kind, run in round_.items():
                if isinstance(run, dict) and "cpu" in run:
                    (plain if kind == "json" else typed).append(run["cpu"]["service_cpu_s"])
        ratios[name] = round(sorted(typed)[len(typed) // 2] / sorted(plain)[len(plain) // 2], 3)
    return ratios


def wal_bytes_per_record() -> float:
    consumer = _load(CAPACITY)["consumer"]
    return round(float(consumer["wal_bytes_service"]) / float(consumer["records"]), 1)


def one_member(cost: dict[str, float]) -> float:
    """Rows a second one member sustains: its own core, or its one PostgreSQL backend's."""
    return 1e6 / max(cost["member_us"], cost["postgres_us"])


def projection(
    cost: dict[str, float], partitions: int, members: int, primary: argparse.Namespace, wal: float
) -> dict[str, Any]:
    member = one_member(cost)
    bounds = {
        "postgres_cpu": primary.postgres_cores * 1e6 / cost["postgres_us"],
        "postgres_wal": primary.wal_mb_per_second * 1e6 / wal,
    }
    queries = max(1, partitions // _PARTITIONS_PER_QUERY)
    rows: dict[str, Any] = {}
    for route, used in (
        ("per_partition", min(members, partitions)),
        ("whole", min(members, queries)),
    ):
        found = {"members": used * member, **bounds}
        bound = min(found, key=lambda name: found[name])
        rows[route] = {
            "members_used": used,
            "rows_per_second": round(found[bound], -3),
            "bound": bound,
            "wal_mb_per_second": round(found[bound] * wal / 1e6),
        }
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres-cores", type=int, default=16)
    parser.add_argument("--wal-mb-per-second", type=int, default=500)  # the primary's WAL device
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    per_mode, ratios, wal = costs(), format_ratios(), wal_bytes_per_record()
    owners = _load(OWNERS) if OWNERS.exists() else {}
    table = {
        mode: {
            f"{partitions}x{members}": projection(cost, partitions, members, args, wal)
            for partitions in PARTITIONS
            for members in MEMBERS
        }
        for mode, cost in per_mode.items()
    }
    print("| mode | member CPU per record | PostgreSQL CPU per record | one member sustains |")
    print("|---|---|---|---|")
    for mode, cost in per_mode.items():
        print(f"| {mode}, JSON | {cost['member_us']} us | {cost['postgres_us']} us | "
              f"{one_member(cost):,.0f} rows/s |")  # fmt: skip
    print(f"typed formats' member CPU against JSON's: {ratios}; WAL {wal} bytes a record")
    for mode in per_mode:
        print(f"\n{mode}: rows/s (bound) per-partition / whole")
        print("| partitions | " + " | ".join(f"{m} members" for m in MEMBERS) + " |")
        print("|---|" + "---|" * len(MEMBERS))
        for partitions in PARTITIONS:
            cells = []
            for members in MEMBERS:
                cell = table[mode][f"{partitions}x{members}"]
                pp, wh = cell["per_partition"], cell["whole"]
                cells.append(f"{pp['rows_per_second']:,.0f} ({pp['bound']}) / "
                             f"{wh['rows_per_second']:,.0f} ({wh['bound']})")  # fmt: skip
            print(f"| {partitions} | " + " | ".join(cells) + " |")
    figures = {
        "postgres_cores": args.postgres_cores, "wal_mb_per_second": args.wal_mb_per_second,
        "partitions_per_query": _PARTITIONS_PER_QUERY,
        "inputs": {"epochs": EPOCHS.name, "typed": {k: v.name for k, v in TYPED.items()},
                   "capacity": CAPACITY.name, "query_owners": owners.get("at")},
        "cost_us": per_mode, "format_cpu_ratio": ratios, "wal_bytes_per_record": wal,
        "projection": table,
    }  # fmt: skip
    print(f"written to {write_results('scale-projection', figures, directory=args.results_dir)}")


if __name__ == "__main__":
    main()
