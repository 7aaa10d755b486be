from typing import Any

MAX_DEPTH: int

def decode_rows(
    values: list[bytes],
    skip: int,
    fields: tuple[tuple[Any, ...], ...],
    template: tuple[Any, ...],
    limit: int,
) -> list[tuple[Any, ...]]: ...
