"""A configuration or tokenizer vLLM refuses before starting any process (an architecture it does not have, a model
directory without its tokenizer files or its weights) refuses the start, exit 2 with the reason on one line, as the
service's own checks do (was: exit 3, "engine failed to start" and a traceback, as if the engine had died)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from service.models.demo_model import ensure_demo_model
from service.server.supervision.lifecycle import EXIT_STARTUP_REFUSED
from tests.support.server import MODELS, service_env


def _rename_the_architecture(model: Path) -> None:
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "architectures": ["FooBarForCausalLM"]}))


def _drop_the_tokenizer(model: Path) -> None:
    for file in model.glob("tokenizer*"):
        file.unlink()


def _drop_the_weights(model: Path) -> None:
    (model / "model.safetensors").unlink()


@pytest.mark.parametrize(
    ("break_it", "says"),
    [
        # refused by the service's pre-flight, before vLLM builds its configuration (which said: "Model architectures
        # ['FooBarForCausalLM'] are not supported"): the check a hub download runs before the weights come
        (
            _rename_the_architecture,
            "refusing to start: the model's architecture 'FooBarForCausalLM' is neither in vLLM's model registry",
        ),
        # was: exit 3 after 18 s ("engine failed to start", transformers' traceback)
        (_drop_the_tokenizer, "cannot be loaded: Couldn't instantiate the backend tokenizer"),
        # was: exit 3 after 26 s, vLLM's "Cannot find any model weights" inside a worker's traceback
        (_drop_the_weights, "holds no weights: vLLM looks there for *.safetensors, *.bin, *.pt files and finds none"),
    ],
    ids=["architecture", "no-tokenizer", "no-weights"],
)
def test_a_model_vllm_refuses_before_any_process_refuses_the_start(tmp_path, break_it, says):
    model = shutil.copytree(ensure_demo_model(MODELS), tmp_path / "broken")
    break_it(model)
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    out = subprocess.run(
        [sys.executable, "-m", "service", "serve"],
        env=service_env(
            MODELS, model=str(model), host="127.0.0.1", port=str(port), kv_cache_gib="0.1", memory_headroom_gib="0.1"
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = out.stdout + out.stderr
    assert out.returncode == EXIT_STARTUP_REFUSED, log[-3000:]
    assert says in log and "Traceback" not in log, log[-3000:]


def test_a_cache_dir_it_cannot_write_refuses_the_start(tmp_path):
    """Checked before anything is written there: the demo model's build was a traceback, a GGUF file's conversion
    'Not a directory' after the whole report."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    out = subprocess.run(
        [sys.executable, "-m", "service", "serve"],
        env=service_env(blocker / "cache", host="127.0.0.1", port=str(port)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    log = out.stdout + out.stderr
    assert out.returncode == EXIT_STARTUP_REFUSED, log[-3000:]
    assert f"refusing to start: cache_dir '{blocker / 'cache'}' is not a writable directory" in log, log[-3000:]
    assert "SERVICE_CACHE_DIR" in log and "Traceback" not in log, log[-3000:]
