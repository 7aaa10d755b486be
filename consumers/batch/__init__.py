"""A batch's life, from the records a poll returned to their commit: its one owner
(`lifecycle`), the rows planned for each route (`planner`), the commit protocol of rows and
offsets in one transaction (`committer`) and its one-message path (`pipelined`), the
partitions' states it moves (`partitions`), the metrics it counts (`metrics`) and the progress
it logs (`work_log`). Whole epochs: a batch's records of an epoch held in memory until it is
whole (`epoch_assembly`), or staged in the ledger (`epoch_staging`) and published from it
(`epoch_publisher`). The operator's replay of dead letters through the routes
(`dead_letter_replay`) runs a batch of its own."""
