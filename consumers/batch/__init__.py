"""A batch's life, from the records a poll returned to their commit: its one owner
(`lifecycle`), the commit protocol of rows and offsets in one transaction (`committer`), its
one-message path (`pipelined`), the partitions' states it moves (`partitions`) and the metrics
it counts (`metrics`)."""
