"""vLLM's processes forked where decided (service/in_vllm/worker_start.py): the engine core from the API process, which
leaves the child none of its listening sockets, signal handlers or signal wakeup descriptor, each worker from its
engine core; a forked child loads the service's plugin again as a spawned one does.

Each case runs in a fresh interpreter: the fork hooks, once registered, stay for the life of the process. vLLM's
plugin module is a stand-in there (importing vLLM takes seconds); the engine's own forked processes are read back in
tests/integration/test_platform.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

CHILD = """
import json, multiprocessing, os, signal, socket, sys, threading, types
plugins = types.ModuleType("vllm.plugins"); plugins.plugins_loaded = True
vllm = types.ModuleType("vllm"); vllm.plugins = plugins
sys.modules.update({"vllm": vllm, "vllm.plugins": plugins})
os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"  # as vLLM's CPU platform leaves it
process, decided = sys.argv[1:]
# What the API process holds when it starts the engine core: the service's port, and the event loop's wakeup socket.
server = socket.create_server(("127.0.0.1", 0)); port = server.getsockname()[1]
wake_r, wake_w = socket.socketpair(); wake_w.setblocking(False)
signal.set_wakeup_fd(wake_w.fileno())
signal.signal(signal.SIGHUP, lambda *_: None)  # as the draining server's
from service.in_vllm import worker_start
if process == "engine core":
    multiprocessing.parent_process = lambda: object()  # a process multiprocessing started
    said = [worker_start.fork_workers(decided == "fork") for _ in range(2)]  # the plugin may run again in a process
elif process.startswith("api"):
    if process == "api":
        worker_start.keep_process_titles()
    first = next(iter(os.environ))  # the service's start sets variables, maybe the environment's first
    os.environ[first] += "-set"
    said = [worker_start.fork_engine_core(decided == "fork") for _ in range(2)]  # one per engine the service starts
else:  # the plugin in the API process, before vLLM's configuration
    said = [worker_start.fork_workers(decided == "fork")]

def listening(sock):
    try:
        return bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
    except OSError:  # no socket behind the number any more
        return False

def state():
    return {"loaded": plugins.plugins_loaded, "forked": worker_start.forked, "listening": listening(server),
        "wakeup_fd": signal.set_wakeup_fd(-1) == wake_w.fileno(),
        "handlers": signal.getsignal(signal.SIGHUP) is not signal.SIG_DFL}

def fork(pipe):  # from a thread bound to one CPU, as AsyncLLM's thread in the API process can be
    r, w = pipe
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    pid = os.fork()
    if pid == 0:
        try:
            os.write(w, json.dumps(state() | {"cpus": sorted(os.sched_getaffinity(0))}).encode())
        finally:
            os._exit(0)
    os.waitpid(pid, 0)

pipe = os.pipe()
thread = threading.Thread(target=fork, args=(pipe,))
thread.start()
thread.join()
os.close(pipe[1])
child = json.loads(os.read(pipe[0], 1000))
cpus = child.pop("cpus")
child["api_cpus"] = cpus == sorted(os.sched_getaffinity(0))
print(json.dumps({"said": said, "method": os.environ["VLLM_WORKER_MULTIPROC_METHOD"], "child": child,
    "here": state()}))
"""

PARENT = {"loaded": True, "forked": False, "listening": True, "wakeup_fd": True, "handlers": True}
BOUND = {"api_cpus": len(os.sched_getaffinity(0)) == 1}  # a child of the bound thread, unless given the process's CPUs


def run(process: str, decided: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, process, decided], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_api_process_forks_the_engine_core_which_keeps_none_of_its_sockets_and_loads_the_plugins_again():
    state = run("api", "fork")
    assert state["said"] == ["fork", "fork"] and state["method"] == "fork"
    assert state["child"] == {
        "loaded": False,
        "forked": True,
        "listening": False,
        "wakeup_fd": False,
        "handlers": False,
        "api_cpus": True,
    }
    assert state["here"] == PARENT  # the API process keeps its port and its loop's wakeup


def test_an_api_process_that_cannot_name_its_children_spawns_its_engine_core():
    """setproctitle finds no argument area once the environment's first variable was set before it looked: a forked
    engine core would keep the API process's name, which the supervision does not look for."""
    state = run("api without keep_process_titles", "fork")
    assert all(s.startswith("spawn: setproctitle found no argument area") for s in state["said"]), state
    assert state["method"] == "spawn" and state["child"] == PARENT | BOUND


def test_the_engine_core_forks_its_workers_and_a_forked_worker_loads_the_plugins_again():
    state = run("engine core", "fork")
    assert state["said"] == ["fork", "fork"] and state["method"] == "fork"
    # An engine core holds no port of the service's: the API process's hook was not registered here
    assert state["child"] == PARENT | BOUND | {"loaded": False, "forked": True}
    assert state["here"] == PARENT


def test_the_plugin_in_the_api_process_leaves_the_engine_core_to_the_engine_start():
    state = run("plugin in the api process", "fork")
    assert state["method"] == "spawn" and state["child"] == PARENT | BOUND
    assert state["said"][0].startswith("not here")


def test_spawned_processes_where_not_decided():
    for process in ("api", "engine core"):
        state = run(process, "spawn")
        assert state["said"] == ["not asked"] * 2 and state["method"] == "spawn", process
        assert state["child"] == PARENT | BOUND and state["here"] == PARENT, process
