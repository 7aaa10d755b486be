"""The producer job a person runs (`bridge produce`, spark-submit) and what it needs to start:
its Spark session, the executors' environment, the precompiled Spark home, its locations."""
