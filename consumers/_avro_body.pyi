from typing import Any

def decode_rows(
    values: list[bytes], skip: int, fields: tuple[tuple[Any, ...], ...], template: tuple[Any, ...]
) -> list[tuple[Any, ...]]: ...
