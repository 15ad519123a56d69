"""One parse of a GGUF header per use (service/facts/gguf_reader.py): inside `shared_readers()` gguf-py's callers and
transformers' GGUF loaders get the same reader per version of a file; outside it, and after it, gguf-py is as it was.
What is counted is gguf-py's own header parse (`GGUFReader._build_fields`)."""

from __future__ import annotations

import os
import shutil

import gguf
import pytest
from gguf.gguf_reader import GGUFReader

from service.facts.gguf import read_gguf
from service.facts.gguf_reader import shared_readers
from service.facts.model import inspect_model
from service.facts.software import read_software
from service.facts.vllm_source import read_vllm_names
from service.models.gguf_convert import ensure_converted
from service.policy.gguf.model_source import plan_model_source
from tests.support.gguf_models import tiny_gguf
from tests.support.server import MODELS


def test_a_file_is_parsed_once_in_a_block_and_every_time_outside(tmp_path, parses):
    path = tiny_gguf(MODELS, "llama", "Q8_0")
    with shared_readers():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is first  # a str and a Path of the same file
    assert parses == [path.name]
    assert gguf.GGUFReader is GGUFReader
    gguf.GGUFReader(path)
    gguf.GGUFReader(path)
    assert parses == [path.name] * 3


def test_transformers_mapping_reuses_the_facts_reader(tmp_path, parses):
    """read_gguf asks gguf-py and transformers' load_gguf_checkpoint: one parse between them (two before)."""
    path = tmp_path / "model.gguf"
    shutil.copy(tiny_gguf(MODELS, "llama", "Q8_0"), path)
    facts = read_gguf(path)
    assert facts.architecture == "llama" and facts.config["model_type"] == "llama"
    assert parses == [path.name]


def test_a_conversion_parses_the_file_once(tmp_path, parses):
    """The conversion asks transformers' tokenizer builder and gguf-py's reader: one parse (two before); the facts
    read before it are a separate use, parsed once too."""
    path = tmp_path / "model.gguf"
    shutil.copy(tiny_gguf(MODELS, "llama", "Q8_0"), path)
    architectures = read_vllm_names().text_generation_architectures
    plan = plan_model_source(inspect_model(str(path)), "float32", tmp_path / "cache", read_software(), architectures)
    assert parses == [path.name]
    converted = ensure_converted(plan.conversion)
    assert (converted / "tokenizer.json").is_file() and list(converted.glob("*.safetensors"))
    assert parses == [path.name] * 2


def test_a_changed_file_is_parsed_again(tmp_path, parses):
    path = tmp_path / "model.gguf"
    shutil.copy(tiny_gguf(MODELS, "llama", "Q8_0"), path)
    with shared_readers():
        first = gguf.GGUFReader(path)
        shutil.copy(tiny_gguf(MODELS, "llama", "F32"), path)
        os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1))
        second = gguf.GGUFReader(path)
        assert second is not first and second.tensors[0].tensor_type.name != first.tensors[0].tensor_type.name
    assert parses == [path.name] * 2


def test_an_inner_block_keeps_the_outer_blocks_readers(tmp_path, parses):
    path = tiny_gguf(MODELS, "llama", "Q8_0")
    with shared_readers():
        outer = gguf.GGUFReader(path)
        with shared_readers():
            assert gguf.GGUFReader(path) is outer
        assert gguf.GGUFReader(path) is outer
    assert gguf.GGUFReader is GGUFReader
    assert parses == [path.name]


def test_a_file_that_fails_to_parse_is_not_kept(tmp_path):
    path = tmp_path / "cut.gguf"
    path.write_bytes(tiny_gguf(MODELS, "llama", "Q8_0").read_bytes()[:64])
    with shared_readers():
        for _ in range(2):
            with pytest.raises((ValueError, IndexError)):
                gguf.GGUFReader(path)
    assert gguf.GGUFReader is GGUFReader


def test_a_writable_reader_is_not_shared(tmp_path):
    path = tmp_path / "model.gguf"
    shutil.copy(tiny_gguf(MODELS, "llama", "Q8_0"), path)
    with shared_readers():
        assert gguf.GGUFReader(path, "r+") is not gguf.GGUFReader(path, "r+")
