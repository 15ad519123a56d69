"""A configuration vLLM refuses before starting any process (here: an architecture it does not have) refuses the
start, exit 2 with vLLM's reason on one line, as the service's own checks do (was: exit 3, "engine failed to start"
and a traceback, as if the engine had died)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys

from service.demo_model import ensure_demo_model
from service.server.run import EXIT_STARTUP_REFUSED
from tests.support.server import MODELS, service_env


def test_an_architecture_vllm_does_not_have_refuses_the_start(tmp_path):
    model = shutil.copytree(ensure_demo_model(MODELS), tmp_path / "renamed")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "architectures": ["FooBarForCausalLM"]}))
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
    assert "refusing to start: vLLM refuses the engine configuration: " in log, log[-3000:]
    assert "['FooBarForCausalLM'] are not supported" in log and "Traceback" not in log, log[-3000:]
