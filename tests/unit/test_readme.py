"""The README documents every setting the service accepts."""

from __future__ import annotations

from pathlib import Path

from service.settings import Settings

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_every_setting_is_documented():
    missing = [name for name in Settings.model_fields if f"`SERVICE_{name.upper()}`" not in README]
    assert missing == []


def test_readme_gives_the_two_commands():
    assert "make serve" in README and "make test" in README
