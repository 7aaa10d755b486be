"""What a user's own Spark session needs on its classpath for the sink, as `spark.jars.packages`.

The sink itself is Python and needs no jar. Typed columns (`value.format` or `key.format`
`avro`) are encoded by Spark's own `to_avro`, which lives in the `spark-avro` package; a job
reading Kafka with Spark's source needs `spark-sql-kafka-0-10`. Both must be of the installed
PySpark's version and its Scala (2.13 for PySpark 4), which is what this gives:

    SparkSession.builder.config("spark.jars.packages", spark_packages()).getOrCreate()
"""

from __future__ import annotations

SCALA_VERSION = "2.13"  # of every PySpark 4 release


def spark_packages(*, avro: bool = True, kafka_source: bool = False) -> str:
    """Maven coordinates, comma-separated: `spark-avro` (for typed columns) and, with
    `kafka_source`, Spark's Kafka connector, at the installed PySpark's version."""
    import pyspark  # here: what is installed when asked, as Spark will resolve it

    version = pyspark.__version__
    wanted = []
    if avro:
        wanted.append(f"org.apache.spark:spark-avro_{SCALA_VERSION}:{version}")
    if kafka_source:
        wanted.append(f"org.apache.spark:spark-sql-kafka-0-10_{SCALA_VERSION}:{version}")
    return ",".join(wanted)
