"""The tables records land in: which route and table a topic's records go to (`routing`),
each route's target and its columns (`targets`), whether a record's fields make a row of it
(`record_fields`), the route's conversions of a row's values (`conversions`), how a batch of
records is written in each mode, with dead letters (`applier`), tables that follow their writer
schemas (`table_follower`), and the column types Avro (`table_types`), JSON Schema
(`json_schema_types`) and Protobuf (`proto_types`) map to."""
