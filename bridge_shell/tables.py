"""Tables for people, shared by the command line and the demo."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

if TYPE_CHECKING:  # the command line imports this module on every start: keep it light
    from consumers import Position


def positions_table(positions: list[Position], *, title: str) -> Table:
    table = Table(title=title)
    for name in ("group", "topic", "partition", "next offset", "log start", "last stable", "lag",
                 "owner (epoch)", "live member", "updated"):  # fmt: skip
        table.add_column(name, no_wrap=True)
    for p in positions:
        table.add_row(
            p.group,
            p.topic,
            str(p.partition),
            f"[bold red]{p.next_offset} out of range[/]" if p.out_of_range else str(p.next_offset),
            or_dash(p.log_start_offset),
            or_dash(p.last_stable_offset),
            or_dash(p.lag),
            f"{p.owner or '-'} ({p.owner_epoch})",
            p.live_owner or "-",
            p.updated_at.strftime("%Y-%m-%d %H:%M:%S %Z"),
        )
    return table


def or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)
