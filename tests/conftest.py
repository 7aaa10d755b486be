"""Markers, and the one Kafka + PostgreSQL pair each test process shares (one per xdist worker)."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import sys
import tempfile
import uuid
import warnings
from collections.abc import Callable, Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from bridge_shell.stack.kafka import KafkaPorts, KafkaServer, new_cluster_id
from bridge_shell.stack.process import ENV_PORT_RANGE, free_port
from consumers.database.state import StateTables, ensure_state
from tests import heavy_slots, jvm_archive, leftovers, warm_caches
from tests.harness import Endpoints, endpoints
from tests.toxiproxy import Proxy, Toxiproxy, ToxiproxyMissing, toxiproxy_binary

_HERE = Path(__file__).parent

# What the session's processes put in the temporary directory lands in one directory that the
# session removes at its end. JVMs the tests kill (Spark drivers and executors, brokers) never run
# their shutdown hooks, and each Spark application leaves a copy of the 120 MB executor
# environment behind: half a gigabyte in /tmp per run of the suite, until the disk is full.
# Children inherit TMPDIR (Python's tempfile, most programs) and java.io.tmpdir, which is also
# Spark's default spark.local.dir. The JVMs print one "Picked up JAVA_TOOL_OPTIONS" line to
# stderr for it.
# Under pytest-xdist each worker is a process of its own with its own directory, stack and Spark
# driver. The test process's own `tempfile` directory is apart from its children's, so that a
# temporary directory a test leaves behind can be named (tests/leftovers.py).
_SESSION_TMP = Path(tempfile.mkdtemp(prefix="bridge-tests-tmp-"))
_CHILDREN_TMP = _SESSION_TMP / "children"
_OWN_TMP = _SESSION_TMP / "tests"
for _directory in (_SESSION_TMP, _CHILDREN_TMP, _OWN_TMP):
    _directory.mkdir(exist_ok=True)
    _directory.chmod(0o1777)  # like /tmp: PostgreSQL runs as its own user
tempfile.tempdir = str(_OWN_TMP)

# Each worker picks ports (its stack's, its tests' servers', its children's) from a range of its
# own, so that no two workers ever pick the same one (bridge_shell.stack.process.free_port).
# The session's workers share out `BRIDGE_TEST_PORTS`; two sessions side by side (`make test`'s
# passes, tests/passes.py) are given ranges apart.
ENV_SESSION_PORTS = "BRIDGE_TEST_PORTS"
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")


def _session_ports() -> tuple[int, int]:
    low, _, high = os.environ.get(ENV_SESSION_PORTS, "20000-31999").partition("-")
    if not (low.isdigit() and high.isdigit() and 1024 <= int(low) < int(high) <= 65535):
        raise pytest.UsageError(f"{ENV_SESSION_PORTS}: a range of ports, like 20000-31999")
    return int(low), int(high) + 1


if _WORKER.startswith("gw") and _WORKER[2:].isdigit():
    _low, _high = _session_ports()
    _span = (_high - _low) // max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    _first = _low + int(_WORKER[2:]) * _span
    os.environ[ENV_PORT_RANGE] = f"{_first}-{_first + _span - 1}"
os.environ["TMPDIR"] = str(_CHILDREN_TMP)
# The tests' JVMs (Spark drivers and executors, brokers, the registry) mostly start, do a
# little, and stop: C1 alone compiles that for half the CPU (a Spark session and one job: 29-34
# s of CPU, 18 s with it, measured on two cores), which on two cores is time every other test
# gets back. What the benchmarks and users run keeps the JVM's default (tiered) compilation.
_TEST_JVM_OPTIONS = (jvm_archive.C1_ONLY, f"-Djava.io.tmpdir={_CHILDREN_TMP}")
# An xdist worker inherits its controller's: those are replaced, not repeated.
_inherited = os.environ.get("JAVA_TOOL_OPTIONS", "").split()
_kept = [o for o in _inherited if o not in _TEST_JVM_OPTIONS and "java.io.tmpdir=" not in o]
os.environ["JAVA_TOOL_OPTIONS"] = " ".join([*_kept, *_TEST_JVM_OPTIONS])

# The integration tests' peak use of the temporary directory's file system: the session's Kafka
# and PostgreSQL, the brokers and clusters single tests start, and Spark's unpacked executor
# environments: 3.3 GB at the peak of a full run. Below it the suite fails at random places (a
# broker dies, an archive does not unpack), so the session refuses to start instead.
_NEEDED_FREE_BYTES = 5 * 1024**3


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--secure",
        action="store_true",
        help="run the tests marked `secured` (and only those) on the secured local stack: "
        "TLS, SASL/SCRAM and ACLs on Kafka, TLS and SCRAM on PostgreSQL, a principal per role",
    )


def pytest_configure(config: pytest.Config) -> None:
    _refuse_groups_split(config)
    if config.option.basetemp is None:  # under xdist, a worker's is set by the controller
        config.option.basetemp = str(_SESSION_TMP / "pytest")
    leftovers.install(config, markers=[_SESSION_TMP, Path(config.option.basetemp)])
    config.pluginmanager.register(leftovers, "bridge-leftovers")
    heavy_slots.install(config)
    if _is_xdist_controller(config):
        _warm_shared_caches()
    config.addinivalue_line("markers", "unit: no I/O, fast")
    config.addinivalue_line("markers", "integration: needs real Kafka and PostgreSQL")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")
    config.addinivalue_line(
        "markers",
        "heavy: starts a cluster of JVMs, several Spark drivers or the whole pipeline; at most "
        f"{heavy_slots.ENV_SLOTS} (default 2) run at once across the workers",
    )
    config.addinivalue_line(
        "markers", "quick: an integration test `make check` runs too (a few seconds, no fault)"
    )
    config.addinivalue_line(
        "markers",
        "exclusive(name): never runs while another test of that name does, in this session or "
        "another beside it (tests that bind the same fixed ports)",
    )
    config.addinivalue_line(
        "markers", "secured: runs on the secured stack too (pytest --secure runs only these)"
    )


def _is_xdist_controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput") and bool(getattr(config.option, "numprocesses", 0))


def _warm_shared_caches() -> None:
    """What every Spark driver of the run shares (tests/warm_caches.py), built here before the
    workers start if `make test` has not already, so that they only read it."""
    options = warm_caches.warm()
    if options is not None:  # the workers inherit it, and every driver they start
        inherited = os.environ.get("SPARK_SUBMIT_OPTS", "")
        os.environ["SPARK_SUBMIT_OPTS"] = f"{inherited} {options}".strip()


def pytest_sessionfinish(session: pytest.Session) -> None:
    shutil.rmtree(_SESSION_TMP, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The directory decides the marker, so `-m unit` and `-m integration` never miss a test.
    for item in items:
        parts = Path(str(item.path)).relative_to(_HERE).parts
        if parts and parts[0] in ("unit", "integration"):
            item.add_marker(parts[0])
    # The slow tests first, the unit tests last: workers take tests in this order, so the long
    # ones start early and the short ones fill the end instead of one long test running alone.
    # Among the slow, the heavy ones are spread out: a worker waiting for a heavy-test slot
    # (tests/heavy_slots.py) holds few other tests, so two heavy ones in a row would idle it.
    items.sort(key=_start_order)
    items[:] = _heavy_spread(items)
    if config.getoption("--secure"):
        kept = [item for item in items if item.get_closest_marker("secured")]
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept
    if any(item.get_closest_marker("integration") for item in items):
        _refuse_a_full_disk(_SESSION_TMP)


def _refuse_groups_split(config: pytest.Config) -> None:
    """`--dist loadgroup` keeps a group's tests on one worker by adding the group to their
    ids; pytest-xdist 3.8 does it by setting `item._nodeid`, which pytest 9.2 no longer reads,
    so a module's Spark or Kafka cluster would run on several workers at once, slowly and
    flakily, with nothing to say why. Refused at start instead (pyproject.toml pins pytest)."""
    if getattr(config.option, "dist", "no") != "loadgroup":
        return
    pytest_version = tuple(int(p) for p in version("pytest").split(".")[:2])
    xdist_version = tuple(int(p) for p in version("pytest-xdist").split(".")[:2])
    if pytest_version >= (9, 2) and xdist_version <= (3, 8):
        raise pytest.UsageError(
            f"pytest {version('pytest')} with pytest-xdist {version('pytest-xdist')}: --dist "
            "loadgroup would not keep an xdist_group on one worker; install the pytest "
            "pyproject.toml pins (make setup)"
        )


def _heavy_spread(items: list[pytest.Item]) -> list[pytest.Item]:
    """The slow block with its heavy units (a test, or a whole xdist_group) evenly among the
    other slow tests; everything else keeps its place."""
    slow = [item for item in items if _start_order(item) == 0]
    rest = items[len(slow) :]
    units: dict[str, list[pytest.Item]] = {}
    light: list[pytest.Item] = []
    for item in slow:
        if item.get_closest_marker("heavy") is None:
            light.append(item)
            continue
        group = item.get_closest_marker("xdist_group")
        units.setdefault(str(group.args[0]) if group else item.nodeid, []).append(item)
    if not units:
        return items
    spread: list[pytest.Item] = []
    step = len(light) / len(units)
    for n, unit in enumerate(units.values()):
        spread.extend(light[round(n * step) : round((n + 1) * step)])
        spread.extend(unit)
    return spread + rest


def _start_order(item: pytest.Item) -> int:
    if item.get_closest_marker("unit"):
        return 2
    return 0 if item.get_closest_marker("slow") else 1


def _refuse_a_full_disk(directory: Path) -> None:
    free = shutil.disk_usage(directory).free
    if free < _NEEDED_FREE_BYTES:
        pytest.exit(
            f"only {free / 1024**3:.1f} GiB free on the file system of {directory.parent}; the "
            f"integration tests need {_NEEDED_FREE_BYTES / 1024**3:.0f} GiB there (Kafka logs, "
            "PostgreSQL data, Spark's executor environments). Free some space, or point TMPDIR "
            "at a larger file system.",
            returncode=3,
        )


@pytest.fixture(scope="session")
def secure(request: pytest.FixtureRequest) -> bool:
    """Whether this session runs on the secured stack (pytest --secure)."""
    return bool(request.config.getoption("--secure"))


@pytest.fixture(scope="session")
def stack(secure: bool) -> Iterator[Endpoints]:
    """Real Kafka and PostgreSQL for the session; see tests/harness.py for where they come from."""
    with endpoints(secure=secure) as found:
        yield found
        _close_clients_left()


def _close_clients_left() -> None:
    """Before the stack stops: a Kafka client left open would go on reconnecting to it, one
    librdkafka line every few milliseconds until the run ends. Each one still open is closed
    here (the sink's manifest producers, which a driver keeps for its life, are such), and
    their count said."""
    left = _close(_open_clients())
    if left and sys.__stderr__ is not None:
        sys.__stderr__.write(f"\nclosed {left} Kafka client(s) still open at the end\n")


@pytest.fixture(autouse=True)
def _closes_its_kafka_clients(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every Kafka client an integration test starts, the test closes: one left open goes on
    polling (and logging) after the test, and the test that left it is named here."""
    yield
    if request.node.get_closest_marker("integration") is None:
        return
    left = _open_clients(but=_kept_by_the_sink)
    if left:
        _close(left)
        pytest.fail(f"{request.node.nodeid} left {len(left)} Kafka client(s) open: "
                    f"{', '.join(type(c).__name__ for c in left)}", pytrace=False)  # fmt: skip


def _open_clients(*, but: Callable[[Any], bool] = lambda client: False) -> list[Any]:
    """The Kafka clients still open in this process, but those `but` keeps. A look through the
    heap first, and a full collection (a client in a dropped cycle is not left open) only when
    that look finds one: most tests leave none, and collecting a worker's heap after each test
    was a fifth of the workers' own CPU in the whole-epoch tests (0.1-0.2 s a test)."""
    if not _clients_in_heap(but):
        return []
    gc.collect()
    return _clients_in_heap(but)


def _clients_in_heap(but: Callable[[Any], bool]) -> list[Any]:
    from confluent_kafka import Consumer, KafkaException, Producer

    found = []
    for client in [o for o in gc.get_objects() if isinstance(o, (Consumer, Producer))]:
        if but(client):
            continue
        try:
            client.assignment() if isinstance(client, Consumer) else client.flush(0)
        except RuntimeError:
            continue  # closed already
        except KafkaException:
            pass  # open, in a fatal state (a fenced transactional producer): still left open
        found.append(client)
    return found


def _kept_by_the_sink(client: Any) -> bool:
    """The sink's manifest producers: a driver keeps one per query for its life, so that each
    epoch's commit does not wait for a new transactional producer (spark_jobs.manifest_writer)."""
    from spark_jobs import manifest_writer

    return any(client is kept for kept in manifest_writer._producers.values())


def _close(clients: list[Any]) -> int:
    for client in clients:
        # A fenced transactional producer warns that it cannot abort, and confluent-kafka
        # turns that into a SystemError here: closing is all that is wanted, whatever it says.
        with warnings.catch_warnings(), contextlib.suppress(Exception):
            warnings.simplefilter("ignore")
            client.close()
    return len(clients)


@pytest.fixture
def registry_process(stack: Endpoints) -> Iterator[Any]:
    """The local stack's registry process, started again after the test whatever happened."""
    if stack.registry is None:
        pytest.skip("needs the local stack's registry process to kill it")
    yield stack.registry
    if not stack.registry.running():
        stack.registry.start()
        stack.registry.wait_ready(120)


@pytest.fixture
def registry_url(stack: Endpoints) -> str:
    """The stack's schema registry (its Confluent-compatible API)."""
    if stack.registry_url is None:
        pytest.skip("no schema registry: set BRIDGE_TEST_SCHEMA_REGISTRY_URL with the others")
    return stack.registry_url


@pytest.fixture
def names() -> dict[str, str]:
    """Fresh names for one consumer test: topic, table, group and state schema."""
    suffix = uuid.uuid4().hex[:10]
    return {"topic": f"c-{suffix}", "table": f"t_{suffix}", "group": f"g-{suffix}",
            "schema": f"s_{suffix}"}  # fmt: skip


@pytest.fixture
def state(stack: Endpoints, names: dict[str, str]) -> StateTables:
    """The consumer's state tables and function, created in a schema of this test's own."""
    return ensure_state(stack.dsn, names["schema"])


@pytest.fixture
def topic_name() -> str:
    """A topic name no other test uses, so tests sharing one broker never see each other."""
    return f"t-{uuid.uuid4().hex[:12]}"


# The sink's fault-injection rules file: fixed for the session, because Spark's Python workers
# inherit the environment of the JVM, which starts once.
_FAULTS_FILE = Path(tempfile.mkdtemp(prefix="bridge-faults-", dir=_SESSION_TMP)) / "rules.json"

FaultRules = Callable[[list[dict[str, Any]]], Path]


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local Spark session (2 cores, up to 4 attempts per task) for the whole test session."""
    from bridge_shell.maven import spark_kafka_jars
    from bridge_shell.spark.spark_session import build_session

    os.environ["BRIDGE_SINK_FAULTS"] = str(_FAULTS_FILE)
    session = build_session(
        "bridge-tests",
        master="local[2,4]",
        jars=spark_kafka_jars(),
        # Small split size, so that a few small files make several partitions (write tasks).
        conf={"spark.sql.files.maxPartitionBytes": "65536", "spark.sql.files.openCostInBytes": "0"},
    )
    yield session
    session.stop()


@pytest.fixture
def fault_rules() -> Iterator[FaultRules]:
    """Install fault-injection rules for this test (see spark_jobs/faults.py); removed after."""

    def install(rules: list[dict[str, Any]]) -> Path:
        _FAULTS_FILE.write_text(json.dumps(rules))
        return _FAULTS_FILE

    yield install
    for leftover in _FAULTS_FILE.parent.iterdir():
        leftover.unlink()


@pytest.fixture(scope="session")
def toxiproxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Toxiproxy]:
    """One Toxiproxy server for the session's network faults. The set-up builds it; a test that
    needs it fails, naming that fix, when it is missing."""
    try:
        binary = toxiproxy_binary()
    except ToxiproxyMissing as exc:
        pytest.fail(str(exc))
    server = Toxiproxy(binary, tmp_path_factory.mktemp("toxiproxy") / "toxiproxy.log")
    yield server
    server.stop()


@pytest.fixture
def proxied_kafka(toxiproxy: Toxiproxy, tmp_path: Path, names: dict[str, str]) -> Iterator[Proxy]:
    """A broker of this test's own that tells its clients to go through a Toxiproxy proxy: a
    client follows the advertised address after its bootstrap, so every byte passes the proxy."""
    broker, controller, front = free_port(), free_port(), free_port()
    proxy = toxiproxy.proxy(
        f"kafka-{names['group']}", f"127.0.0.1:{broker}", listen=f"127.0.0.1:{front}"
    )
    kafka = KafkaServer(
        home=tmp_path / "kafka",
        ports=KafkaPorts(broker=broker, controller=controller, advertised=front),
        cluster_id=new_cluster_id(),
    )
    kafka.start()
    try:
        kafka.wait_ready(120)
        yield proxy
    finally:
        proxy.delete()
        kafka.stop()
