"""A class-data archive (CDS, JEP 350) of a Spark driver's classes, for the tests' drivers.

A Spark driver of the tests starts, runs a few epochs and stops: most of its CPU is loading,
verifying and compiling Spark's classes, again in each of the suite's 60-odd drivers. An
archive of the classes a driver loads, dumped once per machine by a small driver, lets the
others map them ready-made: a session and one small job took 14 s of CPU without it and 8 s
with it (measured here with tests' C1-only JVMs). Tests only, like their C1 flag: what users and
the benchmarks run is left as it is.

The archive is valid only for the JDK and the classpath it was dumped with; the JVM checks both
and, when they differ (a driver with another Spark home), runs without it. Its warning saying
so is turned off: the tests read drivers' logs for noise.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ENV_OFF = "BRIDGE_TEST_NO_CDS"  # set to anything: drivers run without the archive
C1_ONLY = "-XX:TieredStopAtLevel=1"  # the tests' JVMs' compiler (tests/conftest.py)

# A driver's usual work: a session, a batch job, a streaming query of a few micro-batches
# through a Python foreachBatch, then the gateway closed so that the JVM exits (and dumps).
_DUMP = """
import sys
from pyspark import SparkContext
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false").getOrCreate())
spark.range(1000).selectExpr("id % 7 AS k", "id").groupBy("k").count().collect()
query = (spark.readStream.format("rate").option("rowsPerSecond", 50).load()
         .writeStream.foreachBatch(lambda frame, epoch: frame.count())
         .option("checkpointLocation", sys.argv[1]).trigger(processingTime="200 milliseconds")
         .start())
query.processAllAvailable()
query.stop()
spark.stop()
process = SparkContext._gateway.proc
process.stdin.close()  # the gateway exits on its stdin's end: System.exit, then the dump
sys.exit(process.wait(120))
"""


def driver_options(cache: Path, spark_home: Path | None) -> str | None:
    """The JVM options that give a driver of `spark_home` the archive, dumped on first use;
    None when there is no Spark home to dump for or the dump failed."""
    if os.environ.get(ENV_OFF) or spark_home is None:
        return None
    archive = cache / f"cds-spark-driver-{_key(spark_home)}.jsa"
    if not archive.is_file() and not _dump(archive, spark_home):
        return None
    return f"-XX:SharedArchiveFile={archive} -Xlog:cds=off -Xlog:cds+dynamic=off"


def _key(spark_home: Path) -> str:
    """The JDK and the jars the archive is for: another of either is another archive."""
    java = shutil.which("java") or "java"
    binary = Path(os.path.realpath(java)).stat()  # size and mtime: its atime moves every run
    parts = [str(spark_home), os.path.realpath(java), f"{binary.st_size}|{binary.st_mtime_ns}"]
    for jar in sorted((spark_home / "jars").glob("*.jar")):
        stat = jar.stat()
        parts.append(f"{jar.name}|{stat.st_size}|{stat.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def _dump(archive: Path, spark_home: Path) -> bool:
    archive.parent.mkdir(parents=True, exist_ok=True)
    for stale in archive.parent.glob("cds-spark-driver-*.*"):
        stale.unlink(missing_ok=True)  # another JDK's or Spark's, or a dump cut short: 150 MB
    with tempfile.TemporaryDirectory(prefix="bridge-cds-") as work:
        dumped = Path(work) / "driver.jsa"
        env = {
            **os.environ,
            "SPARK_HOME": str(spark_home),
            "SPARK_SUBMIT_OPTS": f"-XX:ArchiveClassesAtExit={dumped} -Xlog:cds=off",
        }
        try:
            done = subprocess.run(
                [sys.executable, "-c", _DUMP, str(Path(work) / "checkpoint")],
                env=env,
                capture_output=True,
                timeout=300,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return False
        if done.returncode != 0 or not dumped.is_file():
            return False
        # Moved into place whole: a driver never maps half an archive.
        shutil.move(dumped, archive.with_suffix(".part"))
        os.replace(archive.with_suffix(".part"), archive)
    return True
