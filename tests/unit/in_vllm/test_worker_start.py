"""The engine core forks its workers where decided (service/in_vllm/worker_start.py), and a forked worker loads the
service's plugin again as a spawned one does.

Each case runs in a fresh interpreter: the fork hook, once registered, stays for the life of the process. vLLM's
plugin module is a stand-in there (importing vLLM takes seconds); the engine's own forked workers are read back in
tests/integration/test_platform.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

CHILD = """
import json, multiprocessing, os, sys, types
plugins = types.ModuleType("vllm.plugins"); plugins.plugins_loaded = True
vllm = types.ModuleType("vllm"); vllm.plugins = plugins
sys.modules.update({"vllm": vllm, "vllm.plugins": plugins})
os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"  # as vLLM's CPU platform leaves it
if sys.argv[1] == "engine core":
    multiprocessing.parent_process = lambda: object()  # a process multiprocessing started
from service.in_vllm.worker_start import fork_workers
said = [fork_workers(sys.argv[2] == "fork") for _ in range(2)]  # twice: the plugin may run again in a process
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(w, json.dumps(plugins.plugins_loaded).encode()); os._exit(0)
os.waitpid(pid, 0)
print(json.dumps({"said": said, "method": os.environ["VLLM_WORKER_MULTIPROC_METHOD"],
    "loaded_in_child": json.loads(os.read(r, 100)), "loaded_here": plugins.plugins_loaded}))
"""


def run(process: str, decided: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, process, decided], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_engine_core_forks_its_workers_and_a_forked_child_loads_the_plugins_again():
    state = run("engine core", "fork")
    assert state == {"said": ["fork", "fork"], "method": "fork", "loaded_in_child": False, "loaded_here": True}


def test_the_api_process_leaves_the_engine_core_spawned():
    state = run("api", "fork")
    assert state["method"] == "spawn" and state["loaded_in_child"] is True
    assert state["said"][0].startswith("not here")


def test_spawned_workers_where_not_decided():
    state = run("engine core", "spawn")
    assert state == {"said": ["not asked"] * 2, "method": "spawn", "loaded_in_child": True, "loaded_here": True}
