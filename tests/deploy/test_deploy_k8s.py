"""deploy/k8s rendered offline and checked: every process a probed, bounded Deployment with its
PodDisruptionBudget, secrets only by reference, RabbitMQ's queue definitions equal to what the code
declares, KEDA's scalers valid against the schema shipped in the repo and reading metrics the code
exports, and every object valid against the Kubernetes schemas (``kubernetes-validate``).

Rendering uses ``kubectl kustomize`` where kubectl exists; otherwise ``render`` below, a small
renderer for the only kustomize features the overlays use (resources, namespace, images, replicas).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml
from dramatiq.brokers.rabbitmq import DEAD_MESSAGE_TTL, dq_name, xq_name

from services.cli.processes import PROCESSES
from services.common.broker import QuorumRabbitmqBroker
from services.common.events import all_queues

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAY = K8S / "overlays" / "local"
KUBERNETES_VERSION = "1.32"
SECRET_SETTINGS = (
    "FATURA_DATABASE_URL",
    "FATURA_AMQP_URL",
    "FATURA_REDIS_URL",
    "FATURA_SECRETS_KEY",
    "FATURA_LIMITER_TOKEN",
    "FATURA_PROVIDER_API_KEY",
)
CLUSTER_SCOPED = {"Namespace"}

Doc = dict[str, Any]


def _load(path: Path) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


def render(directory: Path) -> list[Doc]:
    """kustomize's resources, namespace, images and replicas; anything else is refused."""
    kustomization = _load(directory / "kustomization.yaml")[0]
    known = {"apiVersion", "kind", "resources", "namespace", "images", "replicas"}
    assert set(kustomization) <= known, f"the test renderer does not know {set(kustomization) - known}"
    docs: list[Doc] = []
    for resource in kustomization.get("resources", []):
        path = directory / resource
        docs += render(path) if path.is_dir() else _load(path)
    namespace = kustomization.get("namespace")
    images = {image["name"]: image for image in kustomization.get("images", [])}
    replicas = {entry["name"]: entry["count"] for entry in kustomization.get("replicas", [])}
    for doc in docs:
        if namespace and doc["kind"] not in CLUSTER_SCOPED:
            doc["metadata"]["namespace"] = namespace
        if doc["kind"] == "Deployment" and doc["metadata"]["name"] in replicas:
            doc["spec"]["replicas"] = replicas[doc["metadata"]["name"]]
        for container in _pod_spec(doc).get("containers", []):
            name, _, tag = container["image"].partition(":")
            if name in images:
                image = images[name]
                container["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag)}"
    return docs


def _pod_spec(doc: Doc) -> Doc:
    if doc["kind"] in ("Deployment", "Job"):
        spec: Doc = doc["spec"]["template"]["spec"]
        return spec
    return {}


@pytest.fixture(scope="module")
def rendered() -> list[Doc]:
    docs = render(OVERLAY)
    kubectl = shutil.which("kubectl")
    if kubectl is not None:
        done = subprocess.run(
            [kubectl, "kustomize", str(OVERLAY)], capture_output=True, text=True, timeout=60, check=True
        )
        by_kubectl = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
        assert _ids(by_kubectl) == _ids(docs), "kubectl kustomize and the test renderer disagree"
        docs = by_kubectl
    return docs


def _ids(docs: list[Doc]) -> list[tuple[str, str, str]]:
    return sorted((d["kind"], d["metadata"]["name"], d["metadata"].get("namespace", "")) for d in docs)


def _find(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def test_every_object_is_valid_against_the_kubernetes_and_keda_schemas(rendered: list[Doc]) -> None:
    keda = json.loads((K8S / "schemas" / "keda-scaledobject-v1alpha1.json").read_text(encoding="utf-8"))
    kinds = set()
    for doc in rendered:
        kinds.add(doc["kind"])
        if doc["kind"] == "ScaledObject":
            jsonschema.validate(doc, keda)
        else:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    assert {"Deployment", "PodDisruptionBudget", "Job", "ConfigMap", "ScaledObject", "Service"} <= kinds


def test_every_process_is_a_probed_bounded_deployment_with_a_disruption_budget(
    rendered: list[Doc], monkeypatch: pytest.MonkeyPatch
) -> None:
    for spec in PROCESSES:
        deployment = _find(rendered, "Deployment", spec.name)
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert container["args"] == ["run", spec.name]
        assert container["image"] == "fatura:dev"
        for probe in ("readinessProbe", "livenessProbe"):
            assert {"httpGet", "grpc"} & set(container[probe]), f"{spec.name} {probe}"
        for bound in ("requests", "limits"):
            assert set(container["resources"][bound]) == {"cpu", "memory"}, spec.name
        budget = _find(rendered, "PodDisruptionBudget", spec.name)
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
        # An HTTP readiness probe asks the port the process itself says it answers /readyz on.
        readiness = container["readinessProbe"].get("httpGet")
        if readiness is not None:
            for item in container.get("env", []):
                if "value" in item:
                    monkeypatch.setenv(item["name"], item["value"])
            url = spec.ready_url()
            assert url is not None
            assert (readiness["path"], readiness["port"]) == ("/readyz", urlsplit(url).port), spec.name
            for item in container.get("env", []):
                if "value" in item:
                    monkeypatch.delenv(item["name"])


def test_secrets_are_only_referenced(rendered: list[Doc]) -> None:
    assert not [d for d in rendered if d["kind"] == "Secret"]
    for doc in rendered:
        for container in _pod_spec(doc).get("containers", []):
            for item in container.get("env", []):
                if item["name"] in SECRET_SETTINGS:
                    assert "value" not in item, item["name"]
                    assert item["valueFrom"]["secretKeyRef"]["name"] == "fatura-secrets"
    for doc in rendered:
        if doc["kind"] == "ConfigMap":
            assert not set(doc["data"]) & set(SECRET_SETTINGS), doc["metadata"]["name"]


def test_the_migration_job_runs_fatura_migrate(rendered: list[Doc]) -> None:
    job = _find(rendered, "Job", "fatura-migrate")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["migrate"]


def test_rabbitmq_definitions_declare_the_queues_exactly_as_the_broker_does(rendered: list[Doc]) -> None:
    broker = QuorumRabbitmqBroker(url="amqp://127.0.0.1")
    expected = []
    for queue in all_queues("fatura"):
        for name, arguments in (
            (queue, broker._build_queue_arguments(queue)),
            (dq_name(queue), broker._build_queue_arguments(dq_name(queue))),
            (xq_name(queue), {"x-message-ttl": DEAD_MESSAGE_TTL}),
        ):
            expected.append(
                {"name": name, "vhost": "/", "durable": True, "auto_delete": False, "arguments": arguments}
            )
    config = _find(rendered, "ConfigMap", "rabbitmq-definitions")
    definitions = json.loads(config["data"]["definitions.json"])
    assert definitions["queues"] == expected, json.dumps(expected, indent=2)
    # The local overlay's RabbitMQ loads these definitions at boot.
    volumes = _find(rendered, "Deployment", "rabbitmq")["spec"]["template"]["spec"]["volumes"]
    sources = [s["configMap"]["name"] for v in volumes if "projected" in v for s in v["projected"]["sources"]]
    assert "rabbitmq-definitions" in sources
    quorum = [q["name"] for q in expected if q["arguments"].get("x-queue-type") == "quorum"]
    assert sorted(quorum) == sorted([*all_queues("fatura"), *map(dq_name, all_queues("fatura"))])


def test_keda_scales_the_workers_on_metrics_the_code_exports(rendered: list[Doc]) -> None:
    exported: set[str] = set()
    for path in (ROOT / "services").rglob("*.py"):
        source = path.read_text(encoding="utf-8")
        exported |= set(re.findall(r'(?:Gauge|Counter|Histogram)\(\s*"(fatura_[a-z0-9_]+)"', source))
    targets = {}
    for scaled in (d for d in rendered if d["kind"] == "ScaledObject"):
        targets[scaled["spec"]["scaleTargetRef"]["name"]] = scaled
        for trigger in scaled["spec"]["triggers"]:
            assert trigger["type"] == "prometheus"
            for metric in re.findall(r"fatura_[a-z0-9_]+", trigger["metadata"]["query"]):
                assert metric in exported, f"{metric} is not exported by any process"
    assert set(targets) == {"inference-worker", "delivery-worker"}
    for name in targets:
        _find(rendered, "Deployment", name)
