"""Every kustomization under deploy/ renders with the real `kubectl kustomize` and validates against
Kubernetes' own schemas (`kubernetes-validate`, strict: unknown fields are errors). The Prometheus
Operator's kinds have no schema there; their content is checked by tests/unit/test_deploy_static.py
and promtool."""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

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


def test_both_kustomizations_are_found() -> None:
    assert {p.relative_to(DEPLOY).as_posix() for p in KUSTOMIZATIONS} == {"k8s", "k8s-examples/vllm-upstream"}


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_renders_and_validates_strictly(directory: Path) -> None:
    docs = render(directory)
    assert {d["kind"] for d in docs} >= {"Namespace", "ConfigMap", "Deployment", "Service"} | OPERATOR_KINDS
    for doc in docs:
        if doc["kind"] in OPERATOR_KINDS:
            assert doc["apiVersion"] == "monitoring.coreos.com/v1"
            continue
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
        assert doc["metadata"].get("namespace", "enginegate") == "enginegate"


def test_the_validator_rejects_an_unknown_field() -> None:
    (deployment,) = [d for d in render(DEPLOY / "k8s") if d["kind"] == "Deployment"]
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {"httpGet": {"path": "/ready"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, kubernetes_validate.latest_version(), strict=True)
