"""The README documents every setting the service accepts, and the routes it serves, as the code has them."""

from __future__ import annotations

import re
from pathlib import Path

from service.server.routes import ENGINE_ROUTES, LORA_ROUTES, SERVICE_ROUTES
from service.settings import Settings, settings_table

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_every_setting_is_documented():
    missing = [name for name in Settings.model_fields if f"`SERVICE_{name.upper()}`" not in README]
    assert missing == []


def test_the_settings_table_is_the_one_the_fields_make():
    """Names, defaults and meanings as in service/settings.py (regenerate with settings_table())."""
    assert settings_table() in README


def test_the_endpoint_table_lists_exactly_the_served_routes():
    table = README[README.index("## Endpoints") : README.index("With an API key configured")]
    listed = set(re.findall(r"`(?:GET |POST )?(/[\w/{}.:-]*)`", table))
    served = set(SERVICE_ROUTES) | ENGINE_ROUTES | LORA_ROUTES
    assert listed == served, listed ^ served


def test_readme_gives_the_two_commands():
    assert "make serve" in README and "make test" in README
