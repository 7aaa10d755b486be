"""One error hierarchy for the whole project; leaves carry the data a caller needs."""

from __future__ import annotations


class BridgeError(Exception):
    """Base of every error raised on purpose by bridge."""


class ConfigError(BridgeError):
    """The configuration was refused; `problems` holds one `(path, message)` per offending key."""

    def __init__(self, problems: list[tuple[str, str]], *, source: str | None = None) -> None:
        self.problems = problems
        self.source = source
        where = f" in {source}" if source else ""
        lines = "\n".join(f"  {path}: {message}" for path, message in problems)
        super().__init__(f"invalid configuration{where}:\n{lines}")


class StackError(BridgeError):
    """The local stack could not be prepared, started, or stopped."""


class MissingToolError(StackError):
    """A program the local stack needs (java, mvn, the PostgreSQL server) is not installed."""

    def __init__(self, tool: str, hint: str) -> None:
        self.tool = tool
        super().__init__(f"{tool} not found: {hint}")


class ServerStartError(StackError):
    """A server process did not become ready; `log_path` points at its log."""

    def __init__(self, server: str, reason: str, *, log_path: str | None = None) -> None:
        self.server = server
        self.log_path = log_path
        tail = f" (see {log_path})" if log_path else ""
        super().__init__(f"{server} did not start: {reason}{tail}")


class PermissionMissing(BridgeError):
    """A principal or role lacks a right it needs; the message names the right and the grant."""


class StateSchemaTooNew(BridgeError):
    """bridge's own tables were migrated by a newer release than this one; running on them could
    write what that release does not expect, so this one refuses to start."""

    def __init__(self, *, schema: str, found: str, known: str) -> None:
        self.schema = schema
        self.found = found
        self.known = known
        super().__init__(
            f"the state tables in schema {schema!r} are at version {found}, newer than this "
            f"release of bridge knows (up to version {known}): run a release that knows "
            f"version {found}"
        )
