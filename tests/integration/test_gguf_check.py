"""A GGUF file is checked against llama.cpp before the service says ready (service/policy/gguf/gguf_check.py): llama.cpp
scores a fixed text on the file once per converted copy, the engine scores the same token ids, and a disagreement
beyond the bound refuses the start with the reason. The default model is a GGUF file, so `make serve` runs the check;
a copy converted wrongly (its final norm stored plus one, as Gemma's norms are, in a llama model) is refused, not
served."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import httpx
import pytest

from harness import ServerProcess
from service.models.llama_cpp_reference import REFERENCE, TEXT
from service.policy.gguf.gguf_check import MEAN_BOUND
from service.server.supervision.lifecycle import EXIT_STARTUP_REFUSED
from tests.support.server import DEFAULT_MODEL, MODELS, service_env

pytestmark = pytest.mark.engine
FIGURES = re.compile(r"differ from llama.cpp's by ([\d.]+) on average \(at most ([\d.]+)\); the top token the same")
COPY = re.compile(r"GGUF \S+: (?:converting to \S+ at|using the converted copy at) (\S+)")


def converted_copy(log: str) -> Path:
    found = COPY.search(log)
    assert found, log[-3000:]
    return Path(found[1])


def test_the_default_models_file_is_checked_against_llama_cpp_before_ready(default_server):
    check = httpx.get(f"{default_server.url}/v1/hardware", headers=default_server.headers(), timeout=30).json()
    assert check["gguf_check"]["passed"] is True, check.get("gguf_check")
    mean, worst = map(float, FIGURES.search(check["gguf_check"]["reason"]).groups())
    assert mean <= MEAN_BOUND and worst >= mean
    log = default_server.process.log_tail(10**6)
    assert log.index("GGUF check against llama.cpp passed") < log.index("ready: serving")
    reference = json.loads((converted_copy(log) / REFERENCE).read_text())
    assert reference["text"] == TEXT and len(reference["logprobs"]) == len(reference["tokens"]) - 1 >= 32


def _store_the_norm_with_an_offset(copy: Path) -> None:
    """The final norm's weights plus one, as Gemma's files store them, in a llama copy: same names, shapes and dtypes,
    so the same bytes, and the copy still reads as finished."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    for shard in copy.glob("*.safetensors"):
        with safe_open(shard, "pt") as f:
            metadata, tensors = f.metadata(), {name: f.get_tensor(name) for name in f.keys()}
        if (norm := "model.norm.weight") in tensors:
            size = shard.stat().st_size
            save_file({**tensors, norm: tensors[norm] + 1}, shard, metadata=metadata)
            assert shard.stat().st_size == size
            return
    raise AssertionError(f"no final norm in {copy}")


def test_a_copy_whose_norm_kept_an_offset_is_refused_before_ready(default_server, tmp_path):
    copy = converted_copy(default_server.process.log_tail(10**6))
    cache = tmp_path / "cache"
    broken = shutil.copytree(
        copy, cache / copy.relative_to(MODELS)
    )  # the same key: no conversion, llama.cpp's scores kept
    _store_the_norm_with_an_offset(broken)
    env = service_env(cache, model=DEFAULT_MODEL, kv_cache_gib="0.5")
    process = ServerProcess(env, tmp_path / "gguf-check.log", name="gguf-check").start()
    try:
        with pytest.raises(RuntimeError, match=f"exited with {EXIT_STARTUP_REFUSED}"):
            process.wait_ready(timeout=480)
    finally:
        process.kill_group()
    log = process.log_tail(10**6)
    assert "using the converted copy" in log and "llama.cpp scored" not in log, log[-3000:]
    refused = re.search(r"refusing to start: GGUF check against llama.cpp: (.*)", log)
    assert refused and "the engine's answers differ from llama.cpp's" in refused[1], log[-3000:]
    mean = float(FIGURES.search(refused[1])[1])
    assert mean > MEAN_BOUND
    assert "ready: serving" not in log
