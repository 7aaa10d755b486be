"""A batch's life, from the records a poll returned to their commit: its one owner
(`lifecycle`), the rows planned for each route (`planner`), the commit protocol of rows and
offsets in one transaction (`committer`) and its one-message path (`pipelined`), the
progress it logs (`work_log`), the partitions held at a record while the others go on
(`partition_holds`), and the records of a Spark task's second write of an epoch it leaves out
(`replays`). What a batch uses but does not own lives beside it: the state of
each partition it moves (`consumers.partitions`), whole epochs it holds, stages or publishes
(`consumers.epochs`), the metrics it counts (`consumers.metrics`)."""
