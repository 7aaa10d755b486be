"""deploy/kubernetes, checked offline: every document decoded strictly into its k8s.io/api type
(tools/k8scheck), the selectors matching their pods, the probes on the consumer's HTTP port,
and each ConfigMap's bridge.yaml loaded by bridge's own settings with its secret files."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from bridge.kafka_admin import create_topic
from bridge.settings import load_settings
from bridge_shell.stack.process import free_port
from bridge_shell.stack.spark import DaemonPorts, SparkCluster
from tests.consumer_helpers import drained, eventually, http_get, produce, sql
from tests.harness import Endpoints
from tests.kafka_helpers import read_messages

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "deploy" / "kubernetes"
ENSURE = ROOT / "scripts" / "ensure-k8scheck.sh"


def _k8scheck(*files: Path) -> subprocess.CompletedProcess[str]:
    built = subprocess.run(["bash", str(ENSURE)], capture_output=True, text=True, check=False)
    if built.returncode != 0:
        pytest.fail(f"k8scheck unavailable ({built.stderr.strip()}); run `make setup`")
    binary = built.stdout.strip().splitlines()[-1]
    return subprocess.run(
        [binary, *map(str, files)], capture_output=True, text=True, check=False, timeout=60
    )


def _documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]


def test_the_manifests_decode_strictly_into_the_kubernetes_api_types() -> None:
    checked = _k8scheck(MANIFESTS / "consumer.yaml", MANIFESTS / "producer.yaml")
    assert checked.returncode == 0, checked.stderr
    kinds = [line.split("(", 1)[1].rstrip(")") for line in checked.stdout.splitlines()]
    assert kinds == [
        "ConfigMap bridge-consumer-config", "Deployment bridge-consumer",
        "PodDisruptionBudget bridge-consumer", "Service bridge-consumer-metrics",
        "ServiceAccount bridge-spark", "Role bridge-spark", "RoleBinding bridge-spark",
        "Service bridge-producer-driver", "PersistentVolumeClaim bridge-producer-checkpoint",
        "Deployment bridge-producer", "ConfigMap bridge-producer-config",
    ]  # fmt: skip


_PDB_SELECTOR = "  selector:\n    matchLabels:\n      app.kubernetes.io/name: bridge-consumer\n---"


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (("readinessProbe:", "readinesProbe:"), 'unknown field "readinesProbe"'),
        (("memory: 256Mi", "memory: lots"), "quantities must match"),
        ((_PDB_SELECTOR, _PDB_SELECTOR.replace("bridge-consumer", "bridge-consumr")),
         "PodDisruptionBudget bridge-consumer): its selector"),
    ],
)  # fmt: skip
def test_a_misspelled_field_a_bad_quantity_or_a_selector_of_no_pod_fails_the_check(
    tmp_path: Path, change: tuple[str, str], said: str
) -> None:
    text = (MANIFESTS / "consumer.yaml").read_text()
    assert change[0] in text
    broken = tmp_path / "consumer.yaml"
    broken.write_text(text.replace(change[0], change[1], 1))
    checked = _k8scheck(broken)
    assert checked.returncode == 1 and said in checked.stderr, checked.stderr


def test_the_consumers_probes_and_port_are_its_configurations_and_its_config_loads(
    tmp_path: Path,
) -> None:
    config, deployment = _documents("consumer.yaml")[:2]
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "kafka-password").write_text("s3cret\n")
    (secrets / "postgres-dsn").write_text("postgresql://bridge:pw@postgres:5432/bridge\n")
    (secrets / "ca.crt").write_text("")
    text = config["data"]["bridge.yaml"].replace("/etc/bridge/secrets", str(secrets))
    (tmp_path / "bridge.yaml").write_text(text)
    settings = load_settings(tmp_path / "bridge.yaml")
    assert settings.consumer is not None and settings.consumer.http_port == 9464
    assert settings.kafka.properties["sasl.password"] == "s3cret"
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["ports"] == [{"name": "http", "containerPort": 9464}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    mounted = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/etc/bridge/bridge.yaml", "/etc/bridge/secrets"} <= mounted


def _stage_run(stage: str) -> str:
    """The RUN line of the Dockerfile's build stage `stage`."""
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.endswith(f" AS {stage}"))
    return next(line for line in lines[start:] if line.startswith("RUN "))[len("RUN ") :]


def _image_env(name: str) -> str:
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith(f"ENV {name}="):
            return line.split("=", 1)[1]
    raise AssertionError(f"the Dockerfile sets no {name}")


def _without(tool: str, mirrors: Path) -> str:
    """This machine's PATH with no `tool`, as in the image: each directory that holds it is
    replaced by a mirror of its other entries (a directory like /usr/bin holds what else the
    job needs, bash and java's links among them)."""
    kept = []
    for number, directory in enumerate(os.environ["PATH"].split(os.pathsep)):
        if not (Path(directory) / tool).exists():
            kept.append(directory)
            continue
        mirror = mirrors / str(number)
        mirror.mkdir(parents=True)
        for entry in Path(directory).iterdir():
            if entry.name != tool:
                (mirror / entry.name).symlink_to(entry)
        kept.append(str(mirror))
    assert shutil.which(tool, path=os.pathsep.join(kept)) is None
    return os.pathsep.join(kept)


@pytest.mark.heavy
@pytest.mark.xdist_group("spark-cluster")  # one Spark cluster on the machine at a time
def test_the_producers_command_runs_as_its_container_would_with_the_jars_the_image_holds(
    stack: Endpoints, names: dict[str, str], tmp_path: Path
) -> None:
    """The image's jars stage is run here (its RUN line, under a scratch root); then the
    Deployment's own arguments and environment: no Maven on PATH, the image's cache (empty
    here), the jars where the image's ENV says, against a real Spark standalone master and
    worker. What only a cluster has is swapped for this machine's: the master (spark://), the
    Kubernetes settings, the driver's service name and ports, the brokers (the stack's), the
    paths of the mounts. Beside the worker's executor, an executor pod's command runs as
    Kubernetes runs it: the image's entrypoint with Spark's argument `executor` and the
    environment Spark's scheduler gives the pod; it joins the driver and runs its tasks. The job
    reads its source topic, writes the target topic, and stops on SIGTERM with exit 0, and the
    pod's executor with it."""
    jars = tmp_path / "jars"
    jars.mkdir()
    shutil.copy(ROOT / "spark_jobs" / "jars" / "pom.xml", jars / "pom.xml")
    built = subprocess.run(["bash", "-c", _stage_run("jars").replace("/jars", str(jars))],
                           capture_output=True, text=True, timeout=900, check=False)  # fmt: skip
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    in_image = _image_env("BRIDGE_SPARK_KAFKA_JARS")
    assert "COPY --from=jars /jars/spark-kafka " + in_image in (ROOT / "Dockerfile").read_text()

    deployment = next(d for d in _documents("producer.yaml") if d["kind"] == "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert {"XDG_CACHE_HOME", "SPARK_HOME"}.isdisjoint(e["name"] for e in container["env"])
    assert "--spark-conf=spark.kubernetes.driver.pod.name=$(POD_NAME)" in container["args"]
    source, target = f"{names['topic']}-raw", names["topic"]
    create_topic(stack.bootstrap_servers, source, partitions=2)
    create_topic(stack.bootstrap_servers, target, partitions=2)
    produce(stack, source, [(None, {"order_id": i, "amount": i}) for i in range(50)])
    config = tmp_path / "bridge.yaml"
    config.write_text(yaml.safe_dump({"kafka": {"bootstrap_servers": stack.bootstrap_servers}}))
    cluster = SparkCluster(
        home=tmp_path / "spark", master=_daemon_ports(), workers=[_daemon_ports()],
        worker_cores=1, worker_memory="2g",
    )  # fmt: skip
    driver_port, block_manager_port = free_port(), free_port()
    swapped = {
        "--master": cluster.master_url, "--checkpoint": str(tmp_path / "checkpoint"),
        "--metrics-port": str(free_port()), "--executor-python": sys.executable,
        "--config": str(config), "--source-topic": source, "--topic": target,
    }  # fmt: skip
    driver_settings = {
        "spark.driver.host": "127.0.0.1",  # the driver's Service's name, in a cluster
        "spark.driver.port": str(driver_port),
        "spark.driver.blockManager.port": str(block_manager_port),
    }
    argv = []
    for arg in container["args"]:
        name, _, value = arg.partition("=")
        key = value.partition("=")[0]
        if name == "--spark-conf" and key.startswith("spark.kubernetes."):
            continue  # a cluster's: the pods
        if name == "--spark-conf" and key in driver_settings:
            arg = f"--spark-conf={key}={driver_settings[key]}"
        argv.append(f"{name}={swapped[name]}" if name in swapped else arg)
    cache = tmp_path / "cache"  # the image's XDG_CACHE_HOME, empty: its Spark home made here
    assert _image_env("XDG_CACHE_HOME") == "/opt/cache"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BRIDGE_", "SPARK_"))}
    env |= {"PATH": _without("mvn", tmp_path / "bin"), "XDG_CACHE_HOME": str(cache),
            "BRIDGE_SPARK_KAFKA_JARS": str(jars / "spark-kafka"),
            "BRIDGE_STACK_DIR": "/nonexistent"}  # fmt: skip
    entrypoint = str(Path(sys.executable).parent / "bridge")  # the image's ENTRYPOINT
    log, pod_log = tmp_path / "producer.log", tmp_path / "executor-pod.log"
    (tmp_path / "pod-local").mkdir()
    cluster.start()
    job = pod = None
    try:
        cluster.wait_ready(timeout=120)
        with log.open("wb") as out:
            # In a directory of its own, as the image's WORKDIR: a driver on a cluster unpacks
            # the executors' environment into its working directory (./bridge-env).
            job = subprocess.Popen([entrypoint, *argv], stdout=out, stderr=subprocess.STDOUT,
                                   env=env, cwd=tmp_path, start_new_session=True)  # fmt: skip
        eventually(lambda: bool(cluster.executor_pids()) or job.poll() is not None, timeout=240)
        assert job.poll() is None, log.read_text()[-4000:]
        # The executor's JVM options the driver decided (Spark's module options among them), as
        # the scheduler passes them to a pod: read from the worker's executor.
        [worker_executor, *_] = cluster.executor_pids()
        options = _jvm_options(worker_executor)
        with pod_log.open("wb") as out:
            pod = subprocess.Popen(
                [entrypoint, "executor"], stdout=out, stderr=subprocess.STDOUT,
                env=env | _executor_pod_env(driver_port, tmp_path / "pod-local", options),
                cwd=tmp_path / "pod-local", start_new_session=True,
            )  # fmt: skip
        try:
            eventually(lambda: job.poll() is None and len(read_messages(
                stack.bootstrap_servers, target, partitions=2)) >= 50, timeout=240)  # fmt: skip
        except AssertionError:
            raise AssertionError(log.read_text()[-4000:]) from None
        # Records keep coming, 20 every 2 s, until the pod's executor has run tasks of them.
        more, sent_at = itertools.count(50), [0.0]

        def ran_a_task() -> bool:
            assert pod.poll() is None, pod_log.read_text()[-4000:]
            if time.monotonic() - sent_at[0] >= 2.0:
                produce(stack, source, [(None, {"order_id": i, "amount": i})
                                        for i in itertools.islice(more, 20)])  # fmt: skip
                sent_at[0] = time.monotonic()
            return "Finished task" in pod_log.read_text(errors="replace")

        try:
            eventually(ran_a_task, timeout=180)
        except AssertionError:
            raise AssertionError(pod_log.read_text()[-4000:]) from None
        # The pod's process is the executor's JVM now, from the prepared Spark home.
        command = Path(f"/proc/{pod.pid}/cmdline").read_bytes().decode().split("\0")
        assert "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend" in command
        classpath = command[command.index("-cp") + 1]
        assert classpath.startswith(f"{cache}/bridge/spark-home-"), classpath
        for probe in ("startupProbe", "livenessProbe"):  # on the metrics port, as swapped
            get = container[probe]["httpGet"]
            assert get["port"] == "metrics", get
            url = f"http://127.0.0.1:{swapped['--metrics-port']}{get['path']}"
            assert http_get(url)[0] == 200, (probe, url)
        job.send_signal(signal.SIGTERM)
        assert job.wait(120) == 0, log.read_text()[-3000:]
        assert pod.wait(60) is not None  # told to stop by its driver
    finally:
        for running in (job, pod):
            if running is not None and running.poll() is None:
                os.killpg(running.pid, signal.SIGKILL)
                running.wait(30)
        cluster.stop()
    assert "mvn" not in log.read_text(), log.read_text()[-3000:]
    assert "Successfully registered with driver" in pod_log.read_text(errors="replace")


def _daemon_ports() -> DaemonPorts:
    return DaemonPorts(rpc=free_port(), web_ui=free_port())


def _jvm_options(pid: int) -> list[str]:
    """The JVM options of a running standalone executor, but its class path and heap."""
    command = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    options = command[1 : command.index("org.apache.spark.executor.CoarseGrainedExecutorBackend")]
    classpath = options.index("-cp")
    del options[classpath : classpath + 2]
    return [o for o in options if not o.startswith(("-Xmx", "-Xms"))]


def _executor_pod_env(driver_port: int, local: Path, options: list[str]) -> dict[str, str]:
    """What Spark's Kubernetes scheduler puts in an executor pod's environment
    (BasicExecutorFeatureStep), for one executor of the driver on `driver_port` whose JVM
    options (`spark.executor.extraJavaOptions` with Spark's own, and the startup settings) are
    `options`: one SPARK_JAVA_OPT_<n> each."""
    return {
        **{f"SPARK_JAVA_OPT_{n}": option for n, option in enumerate(options)},
        "SPARK_DRIVER_URL": f"spark://CoarseGrainedScheduler@127.0.0.1:{driver_port}",
        "SPARK_EXECUTOR_ID": "100",
        "SPARK_EXECUTOR_CORES": "1",
        "SPARK_EXECUTOR_MEMORY": "768m",
        "SPARK_APPLICATION_ID": "spark-bridge-producer",
        "SPARK_EXECUTOR_POD_IP": "127.0.0.1",
        "SPARK_EXECUTOR_POD_NAME": "bridge-producer-exec-100",
        "SPARK_RESOURCE_PROFILE_ID": "0",
        "SPARK_LOCAL_DIRS": str(local),
        "SPARK_USER": "bridge",
    }


def as_the_container(
    argv: list[str], pod: dict[str, Any], container: dict[str, Any], writable: Path
) -> list[str]:
    """`argv` run as the manifest's securityContext says: as its user and group, with no
    capability and no new privileges, and, with readOnlyRootFilesystem, in a mount namespace
    whose root is read-only but for `writable` (where the test puts what the manifest's
    emptyDir and mounts hold). The kernel's own tools, as a container runtime uses them."""
    security = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
    drop = ["setpriv", f"--reuid={security['runAsUser']}", f"--regid={security['runAsGroup']}",
            "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]  # fmt: skip
    if security.get("allowPrivilegeEscalation") is False:
        drop.append("--no-new-privs")
    if not security.get("readOnlyRootFilesystem"):
        return [*drop, *argv]
    script = 'mount --bind "$1" "$1" && mount -o remount,bind,ro / && shift && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
            str(writable), *drop, *argv]  # fmt: skip


def test_the_consumers_command_runs_as_its_container_would_and_turns_ready(
    stack: Endpoints, names: dict[str, str], tmp_path: Path
) -> None:
    """The consumer Deployment's own arguments, and its ConfigMap's bridge.yaml with the
    Secret's files (the DSN through `${file:...}`), the cluster's parts swapped for the stack's
    (brokers, the secret files' directory, the port, the topic and table), run as its
    securityContext says (`as_the_container`: its user, no capability, a read-only root): it
    applies the topic's records, its readiness probe's path answers 200, and SIGTERM ends it
    with exit 0."""
    config_map, deployment = _documents("consumer.yaml")[:2]
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # The container's user must reach it: not under pytest's own directory (root's, 0700).
    tmp_path = Path(tempfile.mkdtemp(prefix="bridge-k8s-consumer-"))
    try:
        _run_the_consumer(stack, names, tmp_path, config_map, pod, container)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _run_the_consumer(
    stack: Endpoints,
    names: dict[str, str],
    tmp_path: Path,
    config_map: dict[str, Any],
    pod: dict[str, Any],
    container: dict[str, Any],
) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "postgres-dsn").write_text(stack.dsn + "\n")
    document = yaml.safe_load(config_map["data"]["bridge.yaml"])
    document["kafka"] = {"bootstrap_servers": stack.bootstrap_servers}
    assert document["postgres"]["dsn"] == "${file:/etc/bridge/secrets/postgres-dsn}"
    document["postgres"]["dsn"] = f"${{file:{secrets / 'postgres-dsn'}}}"
    port = free_port()
    [route] = document["consumer"]["routes"]
    document["consumer"] |= {"http_port": port, "state_schema": names["schema"],
                             "group_id": names["group"]}  # fmt: skip
    route |= {"topic": names["topic"], "table": f"public.{names['table']}"}
    config = tmp_path / "bridge.yaml"
    config.write_text(yaml.safe_dump(document))
    create_topic(stack.bootstrap_servers, names["topic"], partitions=2)
    keys = ", ".join(f"{k} bigint" for k in route["key_columns"])
    sql(stack, f"CREATE TABLE public.{names['table']} ({keys} PRIMARY KEY, amount int)")
    # Keyed by order id, as a producer of upserts keys them: one key's records in one partition,
    # in order.
    produce(stack, names["topic"], [(i % 7, {"order_id": i % 7, "amount": i}) for i in range(30)])
    argv = [f"--config={config}" if a.startswith("--config=") else a for a in container["args"]]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BRIDGE_")}
    env |= {"BRIDGE_STACK_DIR": "/nonexistent", "TMPDIR": str(tmp_path)}
    user, group = (pod["securityContext"][k] for k in ("runAsUser", "runAsGroup"))
    for path in [tmp_path, *tmp_path.rglob("*")]:
        os.chown(path, user, group)
    log = tmp_path / "consumer.log"
    command = as_the_container([sys.executable, "-m", "bridge_shell.cli", *argv], pod,
                               container, writable=tmp_path)  # fmt: skip
    with log.open("wb") as out:
        member = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    probe = container["readinessProbe"]["httpGet"]["path"]
    try:
        drained(stack, names, 2, timeout=90)
        eventually(lambda: http_get(f"http://127.0.0.1:{port}{probe}")[0] == 200, timeout=60)
        member.send_signal(signal.SIGTERM)
        assert member.wait(60) == 0, log.read_text()[-3000:]
    finally:
        if member.poll() is None:
            member.kill()
            member.wait(30)
    assert sql(stack, f"SELECT count(*), sum(amount) FROM public.{names['table']}") == [
        (7, sum(range(23, 30)))
    ]
