"""vLLM's processes forked, where decided, instead of spawned: the engine core from the API process, each worker from
its engine core.

vLLM's CPU platform sets VLLM_WORKER_MULTIPROC_METHOD=spawn for every process it starts (`check_and_update_config`,
in the process that builds the engine's configuration), so the engine core imports torch and vLLM again after the
API process has, and each worker after its engine core has. Forked, each starts from its parent's imports: vLLM's
own default on GPUs.

- The API process sets `fork` between vLLM's configuration and the engine core's start (`fork_engine_core`, called
  by the service's engine start). That process runs uvicorn and holds the service's sockets, so a hook in each child
  it forks gives up what the child must not keep: its listening sockets (after a SIGKILL of the API process its
  engine core would hold the port until its parent watch ends it), the event loop's signal wakeup descriptor (each
  signal the engine core got would wake the API's loop) and the server's signal handlers (a SIGHUP would set the
  exit flag of a server copy nobody runs, where a spawned engine core ends). It takes the API process's CPUs, as a
  spawned engine core does: the thread that forks it can be bound to the worker's compute core.
- The engine core's plugin sets `fork` for the workers it starts (`fork_workers`).
- A forked child inherits vLLM's "plugins loaded" mark, so it would skip the service's plugin (its parent watch, its
  state line); the hook clears it, and vLLM loads the plugins again there as in a spawned process. What the plugin
  patched in the parent is inherited, and each patch finds itself in place.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import signal
import socket
import stat

METHOD_ENV = "VLLM_WORKER_MULTIPROC_METHOD"  # vLLM's, read when a process starts another (get_mp_context)
# Per interpreter, and inherited by a forked child with the hooks themselves: each is registered once per lineage.
_hooked = False
_api_pid: int | None = None  # the API process, once its hook is registered
forked = False  # this process was forked where the service set fork: it holds what the plugin did in its parent


def keep_process_titles() -> None:
    """At the API process's start, before it sets any variable: vLLM names its processes (VLLM::EngineCore, which the
    service's supervision looks for) with setproctitle, which finds the process's argument area from the environment
    only while that is as exec left it (a variable set before, and it names nothing). A forked engine core inherits
    what it found here."""
    import setproctitle  # a dependency of vLLM

    setproctitle.getproctitle()


def fork_engine_core(decided: bool) -> str:
    """In the API process, after vLLM's configuration and before AsyncLLM starts the engine core: the start method of
    the engine core it starts next; what became of it."""
    global _api_pid
    if not decided:
        return "not asked"
    import setproctitle

    if not setproctitle.getproctitle():
        return (
            "spawn: setproctitle found no argument area in the API process (a variable was set before "
            "keep_process_titles), so a forked engine core could not be named VLLM::EngineCore"
        )
    os.environ[METHOD_ENV] = "fork"
    if _api_pid is None:
        os.register_at_fork(after_in_child=_leave_the_api_process)
        _api_pid = os.getpid()
    _hook()
    return "fork"


def fork_workers(decided: bool) -> str:
    """In the engine core: the start method of the workers it will start; what became of it."""
    if not decided:
        return "not asked"
    if multiprocessing.parent_process() is None:
        return "not here: the API process starts the engine core (fork_engine_core)"
    os.environ[METHOD_ENV] = "fork"
    _hook()
    return "fork"


def _hook() -> None:
    global _hooked
    if not _hooked:
        os.register_at_fork(after_in_child=_load_plugins_again)
        _hooked = True


def _load_plugins_again() -> None:
    global forked
    import vllm.plugins

    vllm.plugins.plugins_loaded = False
    forked = True
    # The parent's heap, out of this process's collections: each full one would walk it (the API process's whole
    # start-up heap, in a worker) and write to its pages, copying them (Python's advice for fork without exec).
    gc.freeze()


def _leave_the_api_process() -> None:
    if os.getppid() != _api_pid:  # a worker its engine core forked: that parent held none of it
        return
    # The thread that forked it may run bound (an OpenMP runtime binds the thread it starts in): a spawned engine
    # core gets the API process's CPUs, and so does this one, off its worker's compute core where it has more.
    os.sched_setaffinity(0, os.sched_getaffinity(_api_pid))
    signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():  # the server's handlers act on the parent's objects: a spawned child's defaults
        handler = signal.getsignal(sig)
        if callable(handler) and handler is not signal.default_int_handler:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in map(int, os.listdir("/proc/self/fd")):
            if fd != devnull and _listening(fd):
                os.dup2(devnull, fd)  # not closed: objects the child inherited still name the number
    finally:
        os.close(devnull)


def _listening(fd: int) -> bool:
    with contextlib.suppress(OSError):
        if stat.S_ISSOCK(os.fstat(fd).st_mode):
            sock = socket.socket(fileno=fd)
            try:
                return bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
            finally:
                sock.detach()
    return False
