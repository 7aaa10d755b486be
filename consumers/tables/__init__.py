"""The tables records land in: each route's target and its columns (`targets`), how a batch of
records is written in each mode, with dead letters (`applier`), tables that follow their
writer schemas (`table_follower`), and the types they map to (`table_types`)."""
