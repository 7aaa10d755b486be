"""The versions of bridge's own tables and the migrations between them (Alembic).

`consumers.database.state` runs them at every start, under an advisory lock, inside one transaction:
`env.py` is the environment Alembic runs them in, `versions/` holds one file per version. A
migration is a frozen copy of the shape it creates, never an import of the live models, so
that it keeps doing what it did when a later release changes those models.

A new version is a new file in `versions/` whose `down_revision` is the last one's `revision`,
with `upgrade(schema)`; the live models change in the same commit, and
`tests/integration/test_state_migrations.py` checks that the two agree.
"""
