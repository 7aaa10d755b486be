"""bridge: an exactly-once pipeline from Apache Spark, through Apache Kafka, into PostgreSQL."""

from __future__ import annotations

__version__ = "0.3.0"
