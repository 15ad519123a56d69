"""Which version-gated patches every vLLM process applies, decided once here from the installed versions.

- torch 2.10's FxGraphCachePickler lets a ValueError escape where later releases bypass the cache
  (service/in_vllm/fx_graph_cache_patch.py carries out the fix). The decision reaches vLLM's processes in PATCH_ENV, which the service's
  vLLM plugin reads: a process applies the decision, it does not decide again.
- vLLM 0.32's AOT compile-cache loader: service/policy/in_vllm/compile_cache.py.
"""

from __future__ import annotations

import re

from service.in_vllm.contract import FXGRAPH_PATCH_ENV
from service.policy.plan.decision import PolicyResult, env

# The startup decision as every vLLM process reads it: "1" apply, "0" leave torch alone.
_AFFECTED_MINOR = (2, 10)


def needs_fxgraph_pickle_patch(torch_version: str) -> bool:
    match = re.match(r"^(\d+)\.(\d+)", torch_version)
    return match is not None and (int(match[1]), int(match[2])) == _AFFECTED_MINOR


def fxgraph_patch(torch_version: str | None) -> PolicyResult:
    needed = torch_version is not None and needs_fxgraph_pickle_patch(torch_version)
    reason = (
        f"torch {torch_version}: FxGraphCachePickler.dumps turns a ValueError into BypassFxGraphCache"
        if needed
        else f"not needed on torch {torch_version}: only 2.10.x lacks the fix"
    )
    carried = "; carried to every vLLM process in this variable, applied there by the service's vLLM plugin"
    return PolicyResult.of(env(FXGRAPH_PATCH_ENV, "1" if needed else "0", reason + carried, "policy"))
