"""The Spark side of bridge: the exactly-once Kafka sink and the producer job."""
