"""bridge's application shell: what a person runs, never what the core imports.

The command line (`cli/`), the demo, `bridge status`, the local stack of real processes
(`stack/`), Maven, and the Spark side's job and deployment (`spark/`: the producer job, its
session, the executor environment and the precompiled Spark home).
"""
