"""The hub the model tests fetch from: a loopback server answering its routes from real files
(tests/support/hub_server.py), huggingface_hub pointed at it (this machine cannot reach the hub)."""

from __future__ import annotations

import pytest

from tests.support.hub_server import HubServer


@pytest.fixture
def hub(tmp_path, monkeypatch):
    root = tmp_path / "hub"
    server = HubServer(root)
    url = server.start()
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # the test image sets it
    # huggingface_hub reads its endpoint, offline mode and cache when imported
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    yield server
    server.stop()
