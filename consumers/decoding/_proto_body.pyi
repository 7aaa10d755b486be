from typing import Any

def decode_rows(
    values: list[bytes],
    skip: int,
    slots: tuple[tuple[int, int, int] | None, ...],
    template: tuple[Any, ...],
) -> list[tuple[Any, ...]] | None: ...
