"""This member's place in its Kafka group: the partitions Kafka assigns, claimed in the offsets
table before anything is read (`leases`), what Kafka's own health says on `/readyz`
(`kafka_health`), and the whole-epoch topics' partition counts, asked between batches
(`topic_sizes`), which units of the group's queries it reads of the whole routes
(`unit_owners`), and where it starts reading the epoch manifest when it never has
(`manifest_start`). It hands the batch owner (`consumers.batch`) nothing but leases."""
