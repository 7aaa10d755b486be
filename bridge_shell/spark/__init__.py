"""The producer job a person runs (`bridge produce`, spark-submit: `producer_job`) and what
it needs to start: its Spark session (`spark_session`), the executors' environment
(`executor_env`), the precompiled Spark home (`spark_home`), its paths (`locations`), the split
of its epochs that a replay repeats (`epoch_splits`), and an executor pod's command on Kubernetes
(`pod_executor`)."""
