"""The consumer's public API: the service and its run, and the operator's actions on its state
(offsets, epochs, dead letters). The shell (`bridge_shell`) uses these names and nothing behind
them (import contract `consumer-front-door`); the packages behind them are free to change.

Each name is imported on first use, so that a command needing one (`bridge offsets show`)
does not load the whole service with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from consumers.database.ledger_tables import LedgerNames
    from consumers.database.offset_reset import execute_reset, parse_reset_target, plan_reset
    from consumers.database.offsets import OffsetStore, applied_position
    from consumers.database.positions import Position, caught_up_position, read_positions
    from consumers.database.state import ensure_state, state_tables
    from consumers.dead_letter_replay import (
        Chosen,
        DeadLetter,
        Replayed,
        Replayer,
        dead_letters,
    )
    from consumers.decoding.registry_schemas import SchemaCache
    from consumers.epochs.ledger import (
        EpochPhase,
        EpochState,
        Held,
        IllegalEpochMove,
        age_s,
        database_now,
        open_epochs,
    )
    from consumers.epochs.ledger import discard as discard_epoch
    from consumers.epochs.ledger import force as force_epoch
    from consumers.epochs.ledger import hold as hold_epoch
    from consumers.route_check import Checked
    from consumers.route_check import check as check_routes
    from consumers.run import run_consumer
    from consumers.service import ConsumerService
    from consumers.tables.routing import Router

# name -> (module, its name there)
_EXPORTS: dict[str, tuple[str, str]] = {
    # The service.
    "ConsumerService": ("consumers.service", "ConsumerService"),
    "run_consumer": ("consumers.run", "run_consumer"),
    "check_routes": ("consumers.route_check", "check"),
    "Checked": ("consumers.route_check", "Checked"),
    "Router": ("consumers.tables.routing", "Router"),
    "SchemaCache": ("consumers.decoding.registry_schemas", "SchemaCache"),
    # The state schema and the offsets.
    "ensure_state": ("consumers.database.state", "ensure_state"),
    "state_tables": ("consumers.database.state", "state_tables"),
    "OffsetStore": ("consumers.database.offsets", "OffsetStore"),
    "applied_position": ("consumers.database.offsets", "applied_position"),
    "Position": ("consumers.database.positions", "Position"),
    "read_positions": ("consumers.database.positions", "read_positions"),
    "caught_up_position": ("consumers.database.positions", "caught_up_position"),
    "plan_reset": ("consumers.database.offset_reset", "plan_reset"),
    "execute_reset": ("consumers.database.offset_reset", "execute_reset"),
    "parse_reset_target": ("consumers.database.offset_reset", "parse_reset_target"),
    # Whole epochs.
    "EpochState": ("consumers.epochs.ledger", "EpochState"),
    "LedgerNames": ("consumers.database.ledger_tables", "LedgerNames"),
    "EpochPhase": ("consumers.epochs.ledger", "EpochPhase"),
    "Held": ("consumers.epochs.ledger", "Held"),
    "IllegalEpochMove": ("consumers.epochs.ledger", "IllegalEpochMove"),
    "hold_epoch": ("consumers.epochs.ledger", "hold"),
    "open_epochs": ("consumers.epochs.ledger", "open_epochs"),
    "age_s": ("consumers.epochs.ledger", "age_s"),
    "database_now": ("consumers.epochs.ledger", "database_now"),
    "force_epoch": ("consumers.epochs.ledger", "force"),
    "discard_epoch": ("consumers.epochs.ledger", "discard"),
    # Dead letters.
    "DeadLetter": ("consumers.dead_letter_replay", "DeadLetter"),
    "Chosen": ("consumers.dead_letter_replay", "Chosen"),
    "Replayed": ("consumers.dead_letter_replay", "Replayed"),
    "Replayer": ("consumers.dead_letter_replay", "Replayer"),
    "dead_letters": ("consumers.dead_letter_replay", "dead_letters"),
}

__all__ = [
    "Checked",
    "Chosen",
    "ConsumerService",
    "DeadLetter",
    "EpochPhase",
    "EpochState",
    "Held",
    "IllegalEpochMove",
    "LedgerNames",
    "OffsetStore",
    "Position",
    "Replayed",
    "Replayer",
    "Router",
    "SchemaCache",
    "age_s",
    "applied_position",
    "caught_up_position",
    "check_routes",
    "database_now",
    "dead_letters",
    "discard_epoch",
    "ensure_state",
    "execute_reset",
    "force_epoch",
    "hold_epoch",
    "open_epochs",
    "parse_reset_target",
    "plan_reset",
    "read_positions",
    "run_consumer",
    "state_tables",
]


def __getattr__(name: str) -> Any:
    try:
        module, attribute = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'consumers' has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), attribute)
