"""bridge's application shell: what a person runs, never what the core imports.

The command line (`cli/`), the demo (`demo`), `bridge status` (`status`), the printed tables
they share (`tables`), the Kafka Connect translation (`connect_config`), the local stack of
real processes (`stack/`), Maven (`maven`), and the Spark side's job and deployment (`spark/`:
the producer job, its session, the executor environment and the precompiled Spark home).
"""
