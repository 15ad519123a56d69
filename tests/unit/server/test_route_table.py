"""The route table (service/server/http/routes.py) as create_app serves it, before any engine: each route's method
and access, the service's own answers from the startup report, the LoRA routes only with lora_dir. The same routes
with an engine behind them: tests/integration/test_service_routes.py."""

from __future__ import annotations

from argparse import Namespace

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from service.server.http.app import create_app
from service.server.http.metrics import ServiceMetrics
from service.server.http.routes import LORA_ROUTES, ROUTES, Access
from service.server.supervision.lifecycle import Lifecycle
from service.settings import Settings
from service.startup import build_report
from tests.unit.conftest import CPUINFO

KEY = "route-table-key-1"


def client(settings: Settings) -> TestClient:
    report = build_report(settings, model=None, cpuinfo=CPUINFO / "xeon_8480_sapphirerapids.txt", environ={})
    shell = create_app(
        settings,
        report,
        Lifecycle(),
        ServiceMetrics(CollectorRegistry()),
        Namespace(),
        served_model="m",
        demo=False,
    )
    served = TestClient(shell.app, base_url="http://localhost")
    served.settings = settings  # type: ignore[attr-defined]
    return served


@pytest.fixture(scope="module")
def starting() -> TestClient:
    return client(Settings(api_key=KEY))


def test_every_route_answers_its_method_behind_its_access(starting):
    """Without the key: probes answer, the rest 401; with it: the service's own routes answer while the engine
    starts, the engine's 503 (and Retry-After)."""
    for route in ROUTES:
        if route.lora:
            continue
        path = route.path.replace("{model:path}", "org/name")
        bare = starting.request(route.method, path)
        keyed = starting.request(route.method, path, headers={"Authorization": f"Bearer {KEY}"})
        if route.access is Access.PROBE:
            assert bare.status_code in (200, 503) and bare.status_code == keyed.status_code, path
            continue
        open_metrics = route.access is Access.METRICS and not starting.settings.metrics_require_auth
        assert bare.status_code == (200 if open_metrics else 401), path
        if route.access is Access.ENGINE:
            assert keyed.status_code == 503 and "Retry-After" in keyed.headers, path
        else:
            assert keyed.status_code == 200, (path, keyed.text[:200])


def test_the_service_answers_from_the_startup_report(starting):
    keyed = {"Authorization": f"Bearer {KEY}"}
    assert starting.get("/health").json() == {"status": "alive", "phase": "starting"}
    assert starting.get("/ready").status_code == 503
    hardware = starting.get("/v1/hardware", headers=keyed).json()
    assert hardware["hardware"]["model"] == 143 and "prefix_cache" in hardware  # Sapphire Rapids, family 6 model 143
    assert set(starting.get("/version", headers=keyed).json()) == {"service", "vllm", "torch", "zentorch"}
    paths = set(starting.get("/openapi.json", headers=keyed).json()["paths"])
    assert "/v1/hardware" in paths and "/openapi.json" not in paths and not paths & LORA_ROUTES


def test_lora_routes_are_served_only_with_lora_dir(starting):
    """Without lora_dir a load is the catch-all's: 503 while starting, then 404 naming the setting."""
    keyed = {"Authorization": f"Bearer {KEY}"}
    for path in LORA_ROUTES:
        assert starting.post(path, json={}, headers=keyed).status_code == 503
        assert starting.get(path, headers=keyed).status_code == 503
    methods = {(r.method, r.path) for r in ROUTES if r.lora}
    assert methods == {("POST", p) for p in LORA_ROUTES}


def test_the_model_tables_front_end_serves_its_table_before_any_engine_loads(tmp_path):
    """The model table's routes (server/router/app.py) over two listed models whose engines are not loaded: the
    probes answer, the rest need the key, the cards list both, an unknown model is the OpenAI 404, a request that
    names no model is a 400 naming the listed ones."""
    import asyncio

    from service.server.router.app import ROUTES as FRONT_ROUTES
    from service.server.router.app import create_router_app
    from service.server.router.engines import Engines
    from service.server.router.router_metrics import RouterMetrics
    from service.server.router.run import engines_of
    from service.settings import ListedModel
    from service.startup.table_report import plan_table

    models = [ListedModel(source="default", name="chat"), ListedModel(source="demo-tiny-llama", name="demo")]
    settings = Settings(api_key=KEY, models=models, cache_dir=tmp_path)
    table = plan_table(settings, CPUINFO / "xeon_8480_sapphirerapids.txt")
    engines = Engines(engines_of(settings, table), 2, tmp_path / "t", "k", 1.0, RouterMetrics())
    app = create_router_app(settings, table, engines, RouterMetrics(), asyncio.Event())
    front = TestClient(app, base_url="http://localhost")
    keyed = {"Authorization": f"Bearer {KEY}"}
    for route in FRONT_ROUTES:
        path = route.path.replace("{model:path}", "chat")
        bare = front.request(route.method, path)
        assert bare.status_code == (401 if route.access is Access.SERVICE else bare.status_code), path
    assert front.get("/health").json()["models"] == {"chat": "unloaded", "demo": "unloaded"}
    assert front.get("/ready").status_code == 503
    assert [c["id"] for c in front.get("/v1/models", headers=keyed).json()["data"]] == ["chat", "demo"]
    missing = front.get("/v1/models/nope", headers=keyed)
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"
    unnamed = front.post("/v1/chat/completions", json={"messages": []}, headers=keyed)
    assert unnamed.status_code == 400 and "chat, demo" in unnamed.json()["error"]["message"]
