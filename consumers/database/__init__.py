"""PostgreSQL as the consumer uses it: the session and its bounded reconnection
(`db_session`), failures by SQLSTATE (`pg_errors`), the offsets table and its fenced advance
(`offsets`), bridge's own tables and their migrations (`state`, `state_migrations`), the
tables of the ledger of whole epochs (`ledger_tables`; what they mean is `consumers.epochs`'),
the operator's reads and resets of positions (`positions`, `offset_reset`), and the dead-letter
table's one write (`dead_letters`)."""
