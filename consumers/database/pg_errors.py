"""What PostgreSQL's answers mean to the consumer, as groups of psycopg.errors classes.

psycopg raises one class per SQLSTATE, but a code's class is not a subclass of its SQLSTATE
class's (a `UniqueViolation`, 23505, is not an `IntegrityConstraintViolation`, 23000), and its
DB-API bases mix SQLSTATE classes (OperationalError holds classes 40, 53, 54, 55, 57 and 58). So
a group naming a whole SQLSTATE class is every psycopg.errors class whose `sqlstate` is in it,
gathered once from the module; and every test of an answer is an `isinstance` on a group.
"""

from __future__ import annotations

import psycopg
from psycopg import errors


def in_sqlstate_classes(*classes: str) -> tuple[type[psycopg.Error], ...]:
    """Every psycopg.errors class of the SQLSTATE classes named ("22", "23", ...)."""
    found = []
    for name in dir(errors):
        error = getattr(errors, name)
        if (
            not name.startswith("_")
            and isinstance(error, type)
            and issubclass(error, psycopg.Error)
            and error.sqlstate is not None
            and error.sqlstate[:2] in classes
        ):
            found.append(error)
    return tuple(found)


# A record at fault: PostgreSQL refused its values (class 22 data exception, class 23 integrity
# violation), or psycopg would not send them (text holding NUL: a DataError with no SQLSTATE).
# psycopg's DB-API classes hold these two SQLSTATE classes exactly, every code's class included.
RECORD_FAULTS: tuple[type[psycopg.Error], ...] = (
    psycopg.DataError,  # class 22, and psycopg's own refusals of a value
    psycopg.IntegrityError,  # class 23
    # 54000: a value too big for an index of the table ("index row requires 20016 bytes").
    # psycopg counts class 54 as an OperationalError, which the service answers by reconnecting
    # and retrying: without this the record would be retried forever. Its siblings (too many
    # columns, too complex) come from statements, not records.
    errors.ProgramLimitExceeded,
    # 21000: two records of one key that PostgreSQL tells apart and the batch did not ("1" and
    # 1 for an integer key): ON CONFLICT DO UPDATE refuses to touch a row twice. Halves applied
    # in order separate them, and the later record wins, as it should.
    errors.CardinalityViolation,
    # 428C9: a value for a column the table generates: only a statement naming that column can
    # get it, and only a record carrying the column gets it named.
    errors.GeneratedAlways,
)

# The server answers but will not write for now: read-only (class 25, e.g. a replica after a
# failover), a serialization failure or deadlock (class 40), out of resources (class 53: disk
# full, too many connections), a statement timeout (57014).
REFUSALS: tuple[type[psycopg.Error], ...] = (
    *in_sqlstate_classes("25", "40", "53"),
    errors.QueryCanceled,
)
