"""The docs document every setting the service accepts (docs/configuration.md), and the README the routes it serves, as
the code has them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service.server.http.routes import ENGINE_ROUTES, LORA_ROUTES, SERVICE_ROUTES
from service.settings import Settings, settings_table

ROOT = Path(__file__).resolve().parents[3]
README = (ROOT / "README.md").read_text()
CONFIGURATION_DOC = ROOT / "docs" / "configuration.md"
CONFIGURATION = CONFIGURATION_DOC.read_text() if CONFIGURATION_DOC.is_file() else ""
needs_the_doc = pytest.mark.skipif(not CONFIGURATION_DOC.is_file(), reason="docs/ is not in this build context")


@needs_the_doc
def test_every_setting_is_documented():
    missing = [name for name in Settings.model_fields if f"`SERVICE_{name.upper()}`" not in CONFIGURATION]
    assert missing == []


@needs_the_doc
def test_the_settings_table_is_the_one_the_fields_make():
    """Names, defaults and meanings as in service/settings.py (regenerate with settings_table())."""
    assert settings_table() in CONFIGURATION


def test_the_endpoint_table_lists_exactly_the_served_routes():
    table = README[README.index("## Endpoints") : README.index("With an API key configured")]
    listed = set(re.findall(r"`(?:GET |POST )?(/[\w/{}.:-]*)`", table))
    served = set(SERVICE_ROUTES) | ENGINE_ROUTES | LORA_ROUTES
    assert listed == served, listed ^ served


def test_readme_gives_the_two_commands():
    assert "make serve" in README and "make test" in README


@needs_the_doc
def test_every_doc_is_reachable_from_the_readme():
    """From the README's links, following the docs' own links: no page of docs/ that no reader can find."""
    link = re.compile(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)")
    seen, todo = set(), [ROOT / "README.md"]
    while todo:
        page = todo.pop()
        for target in link.findall(page.read_text()):
            path = (page.parent / target).resolve()
            if path.is_file() and path not in seen and path.parent == ROOT / "docs":
                seen.add(path)
                todo.append(path)
    assert sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.resolve() not in seen) == []
