"""deploy/kubernetes, checked offline: every document decoded strictly into its k8s.io/api type
(tools/k8scheck), the selectors matching their pods, the probes on the consumer's HTTP port,
and each ConfigMap's bridge.yaml loaded by bridge's own settings with its secret files."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from bridge.settings import load_settings

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
