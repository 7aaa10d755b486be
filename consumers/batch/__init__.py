"""A batch's life, from the records a poll returned to their commit: its one owner
(`lifecycle`), the rows planned for each route (`planner`), the commit protocol of rows and
offsets in one transaction (`committer`) and its one-message path (`pipelined`), the
partitions' states it moves (`partitions`) and the progress it logs (`work_log`). The
operator's replay of dead letters through the routes (`dead_letter_replay`) runs a batch of its
own. Whole epochs, which a batch holds, stages or publishes, live in `consumers.epochs`."""
