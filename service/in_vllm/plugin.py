"""The service's vLLM entry points (pyproject.toml): the platform the startup report chose, and what each vLLM
process does.

- `platform` (group `vllm.platform_plugins`): vLLM calls it in every process while resolving its platform.
- `every_process` (group `vllm.general_plugins`): vLLM runs it once in each process it starts (API server,
  engine core, workers). It asks Linux for the AMX tile state where decided (service/in_vllm/amx_request.py), applies the
  torch patch as decided at startup, leaves base-model tokens out of vLLM's CPU LoRA ops where adapters are
  served (service/in_vllm/lora_rows.py), registers the service's linear kernels the policy chose (vLLM's
  `register_linear_kernel`), ends the engine's processes with the process that started them
  (service/in_vllm/parent_watch.py), has the engine core fork its workers where decided
  (service/in_vllm/worker_start.py, which also brings a forked process back here), leaves its heap out of the
  interpreter's collection at exit (service/in_vllm/exit_gc.py), and
  logs one line saying which platform that process runs, what became of the patch and the kernels, and where their
  ggml op hands batches to the GEMM.

Both only carry out decisions the startup hook put in the environment (service/startup.py `apply`); without
them (vLLM used without the service) they leave vLLM to decide as usual.
"""

from __future__ import annotations

import importlib
import json
import logging
import multiprocessing
import os

from service.in_vllm import worker_start
from service.in_vllm.amx_request import request_amx_state
from service.in_vllm.contract import (
    AMX_STATE_ENV,
    FXGRAPH_PATCH_ENV,
    KERNELS_ENV,
    LORA_ROWS_ENV,
    PLATFORM_ENV,
    PLATFORM_IMPORTS_ENV,
    SAMPLER_ENV,
    TOP_P_ENV,
    WORKER_START_ENV,
)
from service.in_vllm.exit_gc import skip_exit_collection
from service.in_vllm.fx_graph_cache_patch import apply_fxgraph_pickle_patch
from service.in_vllm.lora_rows import apply_lora_rows_fix
from service.in_vllm.parent_watch import watch_parent
from service.in_vllm.rejection_sampler import use_torch_expand
from service.in_vllm.top_p import use_partial_top_p
from service.in_vllm.worker_start import fork_workers
from service.kernels import register_kernels
from service.kernels.ggml_linear import planned_handover

# A handler of its own: the plugins run before vLLM configures its logging in the API server (from its
# arguments), and in the engine core and workers nothing configures the root logger.
log = logging.getLogger(__name__)
if not log.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log.addHandler(_handler)
    log.setLevel(logging.INFO)
    log.propagate = False

STATE_PREFIX = "service plugin state: "  # followed by one JSON object per process


def platform() -> str | None:
    """The vLLM platform class (qualified name) the startup report chose, or None to let vLLM decide."""
    qualname = os.environ.get(PLATFORM_ENV) or None
    # vLLM's own Zen detection imports zentorch, which registers the torch.ops.zentorch kernels that
    # ZenCpuPlatform dispatches to: do the same (for every module the backend names) when the choice is ours.
    imports = os.environ.get(PLATFORM_IMPORTS_ENV, "") if qualname else ""
    for module in filter(None, imports.split(",")):
        try:
            importlib.import_module(module)
        except (ImportError, OSError) as exc:
            log.error("%s was decided but %s does not import in pid %d: %s", qualname, module, os.getpid(), exc)
            return None
    return qualname


def every_process() -> None:
    if (
        not {
            FXGRAPH_PATCH_ENV,
            PLATFORM_ENV,
            KERNELS_ENV,
            AMX_STATE_ENV,
            LORA_ROWS_ENV,
            SAMPLER_ENV,
            TOP_P_ENV,
            WORKER_START_ENV,
        }
        & os.environ.keys()
    ):
        return
    amx = request_amx_state(os.environ.get(AMX_STATE_ENV) == "1")
    patch = apply_fxgraph_pickle_patch(os.environ.get(FXGRAPH_PATCH_ENV) == "1")
    lora_rows = apply_lora_rows_fix(os.environ.get(LORA_ROWS_ENV) == "1")
    sampler = use_torch_expand(os.environ.get(SAMPLER_ENV) == "torch")
    top_p = use_partial_top_p(os.environ.get(TOP_P_ENV) == "partial")
    kernels = register_kernels(os.environ.get(KERNELS_ENV, ""))
    parent = watch_parent()
    workers = fork_workers(os.environ.get(WORKER_START_ENV) == "fork")
    skip_exit_collection()
    from vllm.platforms import current_platform
    from vllm.usage.usage_lib import is_usage_stats_enabled

    running = f"{type(current_platform).__module__}.{type(current_platform).__qualname__}"
    decided = os.environ.get(PLATFORM_ENV)
    state = {
        "pid": os.getpid(),
        "process": multiprocessing.current_process().name,
        "title": _process_title(),
        "platform": running,
        "decided_platform": decided,
        "fxgraph_patch": patch.status.value,
        "fxgraph_patch_reason": patch.reason,
        "linear_kernels": kernels,
        "ggml_handover": planned_handover(),
        "lora_rows_fix": lora_rows,
        "rejection_sampler": sampler,
        "top_p": top_p,
        "amx_tile_state": amx,
        "watched_parent": parent,
        "workers_start": workers,
        "forked": worker_start.forked,  # from a parent where the service set fork (it holds what was done there)
        "usage_stats": is_usage_stats_enabled(),  # vLLM's own verdict: would this process report usage
    }
    healthy = decided in (None, running) and amx != "refused" and all(v == "registered" for v in kernels.values())
    log.log(logging.INFO if healthy else logging.ERROR, "%s%s", STATE_PREFIX, json.dumps(state))


def _process_title() -> str:
    import setproctitle  # a dependency of vLLM, which sets titles such as VLLM::EngineCore with it

    return setproctitle.getproctitle()
