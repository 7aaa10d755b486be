"""Records into rows: Kafka records and their errors (`records`), JSON values (`rows`), registry
framed values by writer schema (`registry_schemas`), Avro through the C reader (`avro_program`,
`avro_rows`, `_avro_body.c`), JSON Schema (`registry_json_rows`), Protobuf compiled at run
time (`proto_schemas`, `proto_rows`; plain scalar fields through the C reader `_proto_body.c`)
record keys (`record_keys`), Debezium change events unwrapped (`change_events`) and its time
types read as such (`debezium_time`). Nothing
here touches a
database; bytes from outside are hostile until read."""
