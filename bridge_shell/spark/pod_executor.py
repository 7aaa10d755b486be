"""An executor pod's command (`bridge executor`): what Spark's Kubernetes scheduler starts.

It starts each executor pod from `spark.kubernetes.container.image` with the one argument
`executor` and the executor's settings in the environment (`SPARK_DRIVER_URL`,
`SPARK_EXECUTOR_ID`, ...), which the entrypoint of Spark's own image turns into the executor's
JVM. bridge's image runs `bridge`, so `bridge executor` does the same, from the prepared Spark
home (spark_home.py: its Python workers start without compiling PySpark), with Spark's
`tini -s` in front when it runs as the container's first process, to reap the Python workers
an executor leaves and pass signals on.

Kept ours, not Spark's script: the image has no Spark distribution (PySpark's jars only), and
the script needs bash and a Spark home at /opt/spark.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from bridge.errors import ConfigError

BACKEND = "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend"
# What the scheduler sets in an executor pod (Spark's BasicExecutorFeatureStep), as the
# backend's options, in the order Spark's entrypoint.sh passes them.
_OPTIONS = {
    "SPARK_DRIVER_URL": "--driver-url",
    "SPARK_EXECUTOR_ID": "--executor-id",
    "SPARK_EXECUTOR_CORES": "--cores",
    "SPARK_APPLICATION_ID": "--app-id",
    "SPARK_EXECUTOR_POD_IP": "--hostname",
    "SPARK_RESOURCE_PROFILE_ID": "--resourceProfileId",
    "SPARK_EXECUTOR_POD_NAME": "--podName",
}
_JAVA_OPTION = "SPARK_JAVA_OPT_"  # SPARK_JAVA_OPT_0, _1, ...: the executor's -D settings, in order


def executor_command(env: Mapping[str, str], home: Path) -> list[str]:
    """The executor's JVM command line for `env` (an executor pod's environment), run from the
    Spark home `home`; ConfigError naming each setting the scheduler should have set."""
    missing = [name for name in (*_OPTIONS, "SPARK_EXECUTOR_MEMORY") if not env.get(name)]
    if missing:
        raise ConfigError(
            [(name, "not set: Spark's Kubernetes scheduler sets it in each executor pod; "
              "`bridge executor` is an executor pod's command") for name in missing],
            source="the executor pod's environment",
        )  # fmt: skip
    numbered = [
        (int(name[len(_JAVA_OPTION) :]), value)
        for name, value in env.items()
        if name.startswith(_JAVA_OPTION) and name[len(_JAVA_OPTION) :].isdigit()
    ]
    java_options = [value for _, value in sorted(numbered)]
    conf = env.get("SPARK_CONF_DIR") or str(home / "conf")
    classpath = [
        conf,
        env.get("SPARK_CLASSPATH", ""),
        str(home / "jars" / "*"),
        env.get("SPARK_EXTRA_CLASSPATH", ""),
        env.get("SPARK_DIST_CLASSPATH", ""),
    ]
    java = str(Path(env["JAVA_HOME"]) / "bin" / "java") if env.get("JAVA_HOME") else "java"
    memory = env["SPARK_EXECUTOR_MEMORY"]
    command = [java, *java_options, f"-Xms{memory}", f"-Xmx{memory}",
               "-cp", ":".join(p for p in classpath if p), BACKEND]  # fmt: skip
    for name, option in _OPTIONS.items():
        command += [option, env[name]]
    return command


def with_init(command: list[str], *, first_process: bool) -> list[str]:
    """`command` under tini when it is the container's first process and tini is there: a JVM
    as PID 1 neither reaps the orphans its Python workers leave nor gets default signal
    handling."""
    tini = shutil.which("tini")
    if first_process and tini is not None:
        return [tini, "-s", "--", *command]
    return command


def run_executor(home: Path) -> None:
    """Replace this process with the executor's JVM (never returns), or ConfigError."""
    env = {**os.environ, "SPARK_HOME": str(home)}  # its Python workers' PySpark
    command = with_init(executor_command(env, home), first_process=os.getpid() == 1)
    os.execvpe(command[0], command, env)  # noqa: S606 - the executor pod's one command
