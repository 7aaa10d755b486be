"""PostgreSQL as the consumer uses it: the session and its bounded reconnection
(`db_session`), failures by SQLSTATE (`pg_errors`), the offsets table and its fenced advance
(`offsets`), bridge's own tables and their migrations (`state`, `state_migrations`), the
operator's reads and resets of positions (`positions`, `offset_reset`), and the ledger of whole
epochs (`epoch_ledger`) with the chunks of records staged in it (`epoch_chunks`), and the
dead-letter table's one write (`dead_letters`)."""
