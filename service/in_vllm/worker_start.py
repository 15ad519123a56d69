"""The engine core forks its workers, where decided, instead of spawning them.

vLLM's CPU platform sets VLLM_WORKER_MULTIPROC_METHOD=spawn for every process it starts (`check_and_update_config`,
in the process that builds the engine's configuration), so each worker imports torch, vLLM and the model code again
after the engine core has. The engine core is spawned as vLLM has it (the API process that starts it runs uvicorn's
threads and holds the service's sockets, which a fork would copy); in the engine core, which holds neither, the
plugin sets `fork` for the workers it starts next: vLLM's own default on GPUs, where the workers come from the same
engine core. A forked worker inherits vLLM's "plugins loaded" mark, so it would skip the service's plugin (the parent
watch, its state line); a hook clears the mark in the child, and vLLM's worker start loads the plugins again as in a
spawned worker. What the plugin patched in the engine core is inherited, and each patch finds itself in place.
"""

from __future__ import annotations

import multiprocessing
import os

METHOD_ENV = "VLLM_WORKER_MULTIPROC_METHOD"  # vLLM's, read when a process starts another (get_mp_context)
_hooked = False  # per interpreter: a forked child inherits both the hook and this mark


def fork_workers(decided: bool) -> str:
    """Sets the start method of the workers this process will start; what became of it."""
    global _hooked
    if not decided:
        return "not asked"
    if multiprocessing.parent_process() is None:
        return "not here: this process starts the engine core, which vLLM spawns"
    os.environ[METHOD_ENV] = "fork"
    if not _hooked:
        os.register_at_fork(after_in_child=_load_plugins_again)
        _hooked = True
    return "fork"


def _load_plugins_again() -> None:
    import vllm.plugins

    vllm.plugins.plugins_loaded = False
