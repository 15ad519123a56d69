"""vLLM 0.32 compile-cache fix: a warm restart loads the compiled model instead of compiling it again.

Cause. vLLM 0.32 saves every torch.compile result as an AOT artifact under VLLM_CACHE_ROOT and, on the next
start, `_try_load_aot_compiled_fn` (vllm/compilation/decorators.py) loads it and then calls
`loaded_fn._artifacts.compiled_fn.finalize_loading(vllm_config)`. That method exists on vLLM's own
`VllmSerializableFunction`, the artifact of its VLLM_COMPILE mode. The CPU platform, though, switches the mode
to DYNAMO_TRACE_ONCE with torch's plain "inductor" backend (vllm/platforms/cpu.py `check_and_update_config`),
so the artifact is torch's `BundledAOTAutogradSerializableCallable`, whose `__getattr__` forwards to the
compiled function: `'function' object has no attribute 'finalize_loading'`, caught as a load failure, and the
model is compiled again on every start. The artifact itself is complete: torch deserializes the whole compiled
graph, there is nothing left to finalize.

Fix. Give `BundledAOTAutogradSerializableCallable` the no-op `finalize_loading` vLLM expects. Applied in every
vLLM process through our own `vllm.general_plugins` entry point (`register`, pyproject.toml); idempotent;
where the startup decided it (vLLM 0.32.x, the release whose loader has this call: service/policy/in_vllm/compile_cache.py,
carried in AOT_CACHE_PATCH_ENV) and only while torch's class lacks the method.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from service.in_vllm.contract import AOT_CACHE_PATCH_ENV

NAME = "vLLM 0.32 AOT compile cache fix"
_MARK = "_cpu_llm_service_finalize_loading"

# A child of vLLM's logger: it has vLLM's handler in every process vLLM starts.
log = logging.getLogger("vllm.plugins.cpu_llm_service.compile_cache")


def _finalize_loading(self: Any, vllm_config: Any) -> None:
    """torch already deserialized the whole compiled graph: nothing to finalize."""


def apply_patch(decided: bool) -> str:
    """Patch torch's inductor AOT artifact class where the startup decided so; returns what happened (for the log)."""
    if not decided:
        return "not decided by the service's startup"
    from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable as Artifact

    if getattr(Artifact, _MARK, False):
        return "already applied"
    if "finalize_loading" in vars(Artifact):
        return "not needed: torch's artifact class has its own finalize_loading"
    Artifact.finalize_loading = _finalize_loading
    setattr(Artifact, _MARK, True)
    return "applied"


def register() -> None:
    """vllm.general_plugins entry point: vLLM calls it in the API server, the engine core and every worker."""
    log.info("%s: %s", NAME, apply_patch(os.environ.get(AOT_CACHE_PATCH_ENV) == "1"))
