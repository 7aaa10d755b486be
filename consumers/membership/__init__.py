"""This member's place in its Kafka group: the partitions Kafka assigns, claimed in the offsets
table before anything is read (`leases`), and what Kafka's own health says on `/readyz`
(`kafka_health`). It hands the batch owner (`consumers.batch`) nothing but leases."""
