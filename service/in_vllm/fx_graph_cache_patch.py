"""The torch 2.10 FxGraphCache pickle patch.

torch 2.10's `FxGraphCachePickler.dumps` lets a `ValueError` escape (e.g. from tensors with blocked,
prepacked layouts), which fails the whole torch.compile instead of skipping the cache. Later torch releases
turn it into `BypassFxGraphCache` themselves (pytorch/pytorch#176557). vLLM ships the same backport in
`vllm/env_override.py`; ours runs in every vLLM process (service/in_vllm/plugin.py), before or after vLLM's, so
the two must agree on one wrapper. Whether it is needed is decided once at startup (service/policy/in_vllm/patches.py) and
carried to vLLM's processes in FXGRAPH_PATCH_ENV (service/in_vllm/contract.py): a process applies the decision, it does not decide again.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Any

# Our own marks, on the class and on the wrapper.
_OUR_CLASS_MARK = "_cpu_llm_service_fxgraph_dumps_patched"
# vLLM's marks (vllm/env_override.py, v0.32): it skips a class or function carrying them, and so do we.
_VLLM_CLASS_MARK = "_vllm_fxgraph_dumps_patched"
_VLLM_FUNC_MARK = "_vllm_patched"


class PatchStatus(str, enum.Enum):
    APPLIED = "applied"
    ALREADY_APPLIED = "already applied"
    PATCHED_BY_VLLM = "already patched by vLLM"
    NOT_NEEDED = "not needed"


@dataclass(frozen=True)
class PatchResult:
    name: str
    status: PatchStatus
    reason: str

    @property
    def changed(self) -> bool:
        """Whether this call modified torch."""
        return self.status is PatchStatus.APPLIED


NAME = "torch 2.10 FxGraphCache pickle fix"


def _wrap_dumps(original: Any, bypass_cls: type[Exception]) -> Any:
    # updated=(): do not copy the original's __dict__ (and any marks on it) onto the wrapper.
    @functools.wraps(original, updated=())
    def dumps(self: Any, obj: Any) -> bytes:
        try:
            return original(self, obj)
        except ValueError as e:
            raise bypass_cls("Failed to pickle cache key") from e

    # vLLM's mark on our wrapper makes vLLM's own backport skip it when vLLM is imported later: one wrapper.
    setattr(dumps, _VLLM_FUNC_MARK, True)
    return dumps


def apply_fxgraph_pickle_patch(needed: bool) -> PatchResult:
    """Patch `FxGraphCachePickler.dumps` when the startup decision says so; idempotent, and a no-op when vLLM's
    own copy is already in place."""
    if not needed:
        return PatchResult(NAME, PatchStatus.NOT_NEEDED, "decided at startup: only torch 2.10.x lacks the fix")

    # Both classes live in torch._inductor.codecache on 2.10 (where vLLM imports them) and still on 2.13.
    from torch._inductor.codecache import BypassFxGraphCache, FxGraphCachePickler

    if getattr(FxGraphCachePickler, _OUR_CLASS_MARK, False):
        return PatchResult(NAME, PatchStatus.ALREADY_APPLIED, "already applied by this service")
    if getattr(FxGraphCachePickler, _VLLM_CLASS_MARK, False) or hasattr(FxGraphCachePickler.dumps, _VLLM_FUNC_MARK):
        return PatchResult(NAME, PatchStatus.PATCHED_BY_VLLM, "vLLM's env_override already wraps dumps")

    FxGraphCachePickler.dumps = _wrap_dumps(FxGraphCachePickler.dumps, BypassFxGraphCache)
    setattr(FxGraphCachePickler, _OUR_CLASS_MARK, True)
    return PatchResult(NAME, PatchStatus.APPLIED, "a ValueError while pickling a cache key now bypasses the cache")
