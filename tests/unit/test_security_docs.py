"""The security section of docs/deploy.md says what the code grants: its ACL table is
bridge/acls.py's."""

from __future__ import annotations

from pathlib import Path

from bridge import acls

README = Path(__file__).resolve().parents[2] / "docs" / "deploy.md"


def _acl_rows() -> set[tuple[str, ...]]:
    section = README.read_text().split("### Kafka ACLs", 1)[1].split("\n### ", 1)[0]
    rows = set()
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0] in acls.ROLES:
            cells[2] = cells[2].strip("`")  # the name is set as code
            rows.add(tuple(cells))
    return rows


def test_the_readmes_acl_table_is_the_one_the_stack_grants() -> None:
    granted = {
        (role, g.resource, g.name, g.operation, g.why)
        for role in acls.ROLES
        for g in acls.grants(role)
    }
    assert _acl_rows() == granted


def test_the_readmes_table_rights_are_the_ones_the_consumer_checks() -> None:
    section = README.read_text().split("### PostgreSQL grants", 1)[1].split("\n### ", 1)[0]
    assert "An insert route needs INSERT;" in section
    assert acls.table_rights("insert", deletes=False) == ("INSERT",)
    assert set(acls.table_rights("upsert", deletes=True)) == {
        "SELECT",
        "INSERT",
        "UPDATE",
        "DELETE",
    }
    assert "GRANT SELECT, INSERT, UPDATE, DELETE ON public.orders" in section
