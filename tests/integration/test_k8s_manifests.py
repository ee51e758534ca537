"""Every kustomization under deploy/ renders with the real `kubectl kustomize` and validates against
Kubernetes' own schemas (`kubernetes-validate`, strict: unknown fields are errors). The Prometheus
Operator's kinds have no schema there; their content is checked by tests/unit/test_deploy_static.py
and promtool. The Inference Extension's InferencePool and the Gateway API's HTTPRoute are checked
against their upstream CRDs' schemas, vendored (tests/integration/crd_schema.py says what that
covers: everything but the CRDs' CEL rules)."""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration import crd_schema

kubernetes_validate = pytest.importorskip("kubernetes_validate")

pytestmark = pytest.mark.integration
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KUSTOMIZATIONS = sorted(p.parent for p in DEPLOY.rglob("kustomization.yaml"))
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}  # monitoring.coreos.com CRDs


def render(directory: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (it renders kustomizations offline)")
    proc = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"kubectl kustomize {directory} failed: {proc.stderr}"
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def test_every_kustomization_is_found() -> None:
    assert {p.relative_to(DEPLOY).as_posix() for p in KUSTOMIZATIONS} == {
        "k8s", "k8s-examples/vllm-upstream", "k8s-examples/inferencepool", "k8s-examples/shared-database"}


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_renders_and_validates_strictly(directory: Path) -> None:
    docs = render(directory)
    assert {d["kind"] for d in docs} >= {"Namespace", "ConfigMap", "Deployment", "Service"} | OPERATOR_KINDS
    for doc in docs:
        assert doc["metadata"].get("namespace", "enginegate") == "enginegate"
        if doc["kind"] in OPERATOR_KINDS:
            assert doc["apiVersion"] == "monitoring.coreos.com/v1"
            continue
        if crd_schema.known(doc["apiVersion"], doc["kind"]):
            assert crd_schema.errors(doc) == [], doc
            continue
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def _one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return doc


def test_the_inference_pool_is_wired_to_the_gateway_pods_and_its_picker() -> None:
    """The references the API server cannot check: selector -> pods, picker ref -> Service port ->
    container port, route -> pool, the picker's flags and RBAC -> the pool, its config's plugins."""
    docs = render(DEPLOY / "k8s-examples" / "inferencepool")
    pool = _one(docs, "InferencePool")
    gateway = _one(docs, "Deployment", "enginegate")
    pod_labels = gateway["spec"]["template"]["metadata"]["labels"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (target,) = pool["spec"]["targetPorts"]
    assert target["number"] in [p["containerPort"] for p in gateway["spec"]["template"]["spec"]["containers"][0]["ports"]]
    assert "inference.networking.k8s.io/engine-type" not in pod_labels  # read with the EPP's default: vLLM's names
    ref = pool["spec"]["endpointPickerRef"]
    epp_service = _one(docs, "Service", ref["name"])
    assert ref["port"]["number"] in [p["port"] for p in epp_service["spec"]["ports"]]
    epp = _one(docs, "Deployment", ref["name"])
    epp_pod = epp["spec"]["template"]
    assert epp_service["spec"]["selector"].items() <= epp_pod["metadata"]["labels"].items()
    (container,) = epp_pod["spec"]["containers"]
    assert ref["port"]["number"] in [p["containerPort"] for p in container["ports"]]
    args = container["args"]
    assert args[args.index("--pool-name") + 1] == pool["metadata"]["name"]
    assert args[args.index("--pool-namespace") + 1] == "enginegate"
    assert args[args.index("--pool-group") + 1] == pool["apiVersion"].split("/")[0]
    # the picker reads pods and the pool under its own service account
    account = epp_pod["spec"]["serviceAccountName"]
    binding = _one(docs, "RoleBinding", account)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "enginegate"}]
    rules = _one(docs, "Role", binding["roleRef"]["name"])["rules"]
    granted = {(g, r) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]
               if {"get", "watch", "list"} <= set(rule["verbs"])}
    assert {("", "pods"), ("inference.networking.k8s.io", "inferencepools")} <= granted
    # its config: the mounted file, plugins that exist in the EPP v1.5.0 (pkg/epp/framework/plugins), each
    # profile entry a declared plugin, and the metrics source reading enginegate's /metrics
    (mount,) = container["volumeMounts"]
    (volume,) = [v for v in epp_pod["spec"]["volumes"] if v["name"] == mount["name"]]
    config_file = args[args.index("--config-file") + 1]
    assert config_file.startswith(mount["mountPath"] + "/")
    configmap = _one(docs, "ConfigMap", volume["configMap"]["name"])
    config = yaml.safe_load(configmap["data"][config_file.rsplit("/", 1)[1]])
    assert config["kind"] == "EndpointPickerConfig" and config["apiVersion"] == "inference.networking.x-k8s.io/v1alpha1"
    types = {p["type"] for p in config["plugins"]}
    assert types <= {"queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer", "metrics-data-source",
                     "core-metrics-extractor"}
    for profile in config["schedulingProfiles"]:
        assert {p["pluginRef"] for p in profile["plugins"]} <= types
    (source,) = [p for p in config["plugins"] if p["type"] == "metrics-data-source"]
    assert source["parameters"]["path"] == "/metrics"
    # the route sends to the pool
    route = _one(docs, "HTTPRoute")
    refs = [b for rule in route["spec"]["rules"] for b in rule["backendRefs"]]
    assert refs == [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": pool["metadata"]["name"]}]


def test_the_crd_schemas_reject_what_the_api_server_would() -> None:
    docs = render(DEPLOY / "k8s-examples" / "inferencepool")
    pool = _one(docs, "InferencePool")
    route = _one(docs, "HTTPRoute")
    assert crd_schema.errors(pool) == [] and crd_schema.errors(route) == []
    assert (crd_schema.cel_applied(pool), crd_schema.cel_applied(route)) == (2, 21)  # the rules that ran and passed
    broken: list[tuple[dict[str, Any], str]] = []
    unknown = copy.deepcopy(pool)
    unknown["spec"]["endpointPickerRef"]["failuremode"] = "FailOpen"  # misspelt: an unknown field
    broken.append((unknown, "failuremode"))
    bad_enum = copy.deepcopy(pool)
    bad_enum["spec"]["endpointPickerRef"]["failureMode"] = "Open"
    broken.append((bad_enum, "Open"))
    no_ports = copy.deepcopy(pool)
    del no_ports["spec"]["targetPorts"]
    broken.append((no_ports, "targetPorts"))
    twice = copy.deepcopy(pool)
    twice["spec"]["targetPorts"] = [{"number": 8000}, {"number": 8000}]
    broken.append((twice, "must be unique"))  # a CEL rule
    bad_port = copy.deepcopy(pool)
    bad_port["spec"]["targetPorts"] = [{"number": 70000}]
    broken.append((bad_port, "70000"))
    bad_path = copy.deepcopy(route)
    bad_path["spec"]["rules"][0]["matches"][0]["path"]["type"] = "Prefix"
    broken.append((bad_path, "Prefix"))
    bad_meta = copy.deepcopy(route)
    bad_meta["metadata"]["labelz"] = {}
    broken.append((bad_meta, "labelz"))
    for doc, word in broken:
        found = crd_schema.errors(doc)
        assert found and any(word in e for e in found), (word, found)
    # CEL rules ran (cel-python): a Service picker without a port; two rules of HTTPRoute's
    no_epp_port = copy.deepcopy(pool)
    del no_epp_port["spec"]["endpointPickerRef"]["port"]
    broken.append((no_epp_port, "has(self.port)"))
    relative = copy.deepcopy(route)
    relative["spec"]["rules"][0]["matches"][0]["path"]["value"] = "v1"
    broken.append((relative, "startsWith('/')"))
    timeouts = copy.deepcopy(route)
    timeouts["spec"]["rules"][0]["timeouts"]["backendRequest"] = "600s"
    broken.append((timeouts, "backendRequest"))
    for doc, word in broken[-3:]:
        found = crd_schema.errors(doc)
        assert found and any(word in e for e in found), (word, found)
    assert len(crd_schema.cel_rules("inference.networking.k8s.io/v1", "InferencePool")) == 2
    assert len(crd_schema.cel_rules("gateway.networking.k8s.io/v1", "HTTPRoute")) > 20


def _database_env(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (env,) = [e for e in container["env"] if e["name"] == "ENGINEGATE_DATABASE_URL"]
    return env["valueFrom"]["secretKeyRef"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_several_gateway_pods_only_with_a_shared_database(directory: Path) -> None:
    """Without database_url each pod keeps stored responses and keys in its own emptyDir SQLite: a
    second pod behind the Service would 404 the first one's responses. So more than one replica
    needs the Secret required (a pod never falls back to a store of its own) and present with the key."""
    docs = render(directory)
    gateway = _one(docs, "Deployment", "enginegate")
    ref = _database_env(gateway)
    volumes = {v["name"]: v for v in gateway["spec"]["template"]["spec"]["volumes"]}
    assert "emptyDir" in volumes["data"]  # where SQLite lives without the database: the pod's own
    if gateway["spec"].get("replicas", 1) > 1:
        assert ref["optional"] is False, f"{gateway['spec']['replicas']} replicas may start on per-pod SQLite"
        secret = _one(docs, "Secret", ref["name"])
        assert ref["key"] in secret.get("stringData", {}) | secret.get("data", {})
        budget = _one(docs, "PodDisruptionBudget")
        pod_labels = gateway["spec"]["template"]["metadata"]["labels"]
        assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    else:
        assert ref["optional"] is True  # the base runs as it did, on SQLite, until a database is named


def test_the_base_runs_one_pod_and_the_shared_database_example_three() -> None:
    base = _one(render(DEPLOY / "k8s"), "Deployment", "enginegate")
    assert base["spec"]["replicas"] == 1
    shared = render(DEPLOY / "k8s-examples" / "shared-database")
    gateway = _one(shared, "Deployment", "enginegate")
    assert gateway["spec"]["replicas"] == 3
    assert gateway["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    url = _one(shared, "Secret", "enginegate-database")["stringData"]["database_url"]
    assert url.startswith("postgresql://") and "REPLACE-WITH" in url  # an example: no real password shipped
    (container,) = gateway["spec"]["template"]["spec"]["containers"]
    assert len([e for e in container["env"] if e["name"] == "ENGINEGATE_DATABASE_URL"]) == 1


def test_the_validator_rejects_an_unknown_field() -> None:
    (deployment,) = [d for d in render(DEPLOY / "k8s") if d["kind"] == "Deployment"]
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {"httpGet": {"path": "/ready"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, kubernetes_validate.latest_version(), strict=True)
