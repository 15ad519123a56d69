"""The torch 2.10 FxGraphCache pickle patch, against the real torch._inductor.codecache classes.

torch 2.13 (installed) already turns ValueError into BypassFxGraphCache inside `dumps`, so the tests put
torch 2.10's `dumps` body back on the real class: otherwise a ValueError test would pass with no patch at all.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch
from torch._inductor.codecache import BypassFxGraphCache, FxGraphCachePickler

from service.in_vllm.contract import FXGRAPH_PATCH_ENV
from service.in_vllm.fx_graph_cache_patch import PatchStatus, apply_fxgraph_pickle_patch
from service.policy.in_vllm.patches import fxgraph_patch, needs_fxgraph_pickle_patch

_CLASS_ATTRS = ("dumps", "_cpu_llm_service_fxgraph_dumps_patched", "_vllm_fxgraph_dumps_patched")


def dumps_as_in_torch_2_10(self: FxGraphCachePickler, obj: Any) -> bytes:
    """torch 2.10's FxGraphCachePickler.dumps: ValueError is not among the exceptions it converts."""
    try:
        self.dump(obj)
        return self._stream.getvalue()
    except (TypeError, AttributeError, pickle.PicklingError) as e:
        raise BypassFxGraphCache("Failed to pickle cache key") from e
    finally:
        self._stream.seek(0)
        self._stream.truncate(0)


@pytest.fixture
def torch_2_10_pickler():
    """The real class with 2.10's dumps; its own dumps and marks restored afterwards."""
    saved = {name: FxGraphCachePickler.__dict__[name] for name in _CLASS_ATTRS if name in FxGraphCachePickler.__dict__}
    FxGraphCachePickler.dumps = dumps_as_in_torch_2_10
    yield FxGraphCachePickler
    for name in _CLASS_ATTRS:
        if name in FxGraphCachePickler.__dict__:
            delattr(FxGraphCachePickler, name)
    for name, value in saved.items():
        setattr(FxGraphCachePickler, name, value)


class Raises:
    """Pickling it raises the given exception, as a tensor with an unpicklable layout would."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def __reduce__(self):
        raise self.error


def pickler() -> FxGraphCachePickler:
    return FxGraphCachePickler(torch.fx.symbolic_trace(torch.nn.ReLU()))


def test_without_patch_the_value_error_escapes(torch_2_10_pickler):
    with pytest.raises(ValueError):
        pickler().dumps(Raises(ValueError("blocked layout")))


def test_value_error_becomes_bypass_chained(torch_2_10_pickler):
    result = apply_fxgraph_pickle_patch(True)
    assert result.status is PatchStatus.APPLIED and result.changed
    original = ValueError("blocked layout")
    with pytest.raises(BypassFxGraphCache) as caught:
        pickler().dumps(Raises(original))
    assert caught.value.__cause__ is original


def test_other_exceptions_pass_through(torch_2_10_pickler):
    apply_fxgraph_pickle_patch(True)
    with pytest.raises(RuntimeError, match="not a pickling problem"):
        pickler().dumps(Raises(RuntimeError("not a pickling problem")))


def test_normal_pickling_unchanged(torch_2_10_pickler):
    payload = {"shape": (2, 3), "tensor": torch.ones(2, 3), "name": "linear"}
    before = pickler().dumps(payload)
    apply_fxgraph_pickle_patch(True)
    assert pickler().dumps(payload) == before


def test_idempotent(torch_2_10_pickler):
    apply_fxgraph_pickle_patch(True)
    wrapped = FxGraphCachePickler.dumps
    again = apply_fxgraph_pickle_patch(True)
    assert again.status is PatchStatus.ALREADY_APPLIED and not again.changed
    assert FxGraphCachePickler.dumps is wrapped
    assert wrapped.__wrapped__ is dumps_as_in_torch_2_10  # one layer, not two


def test_vllm_marked_class_left_alone(torch_2_10_pickler):
    FxGraphCachePickler._vllm_fxgraph_dumps_patched = True
    result = apply_fxgraph_pickle_patch(True)
    assert result.status is PatchStatus.PATCHED_BY_VLLM
    assert FxGraphCachePickler.dumps is dumps_as_in_torch_2_10


def test_vllm_marked_function_left_alone(torch_2_10_pickler):
    def vllm_dumps(self, obj):
        return dumps_as_in_torch_2_10(self, obj)

    vllm_dumps._vllm_patched = True
    FxGraphCachePickler.dumps = vllm_dumps
    assert apply_fxgraph_pickle_patch(True).status is PatchStatus.PATCHED_BY_VLLM
    assert FxGraphCachePickler.dumps is vllm_dumps


def test_not_needed_leaves_torch_alone(torch_2_10_pickler):
    result = apply_fxgraph_pickle_patch(False)
    assert result.status is PatchStatus.NOT_NEEDED and not result.changed
    assert FxGraphCachePickler.__dict__["dumps"] is dumps_as_in_torch_2_10


def test_the_startup_decision_carries_the_version_gate():
    """The gate is decided once, from the installed torch, and carried to vLLM's processes in FXGRAPH_PATCH_ENV."""
    (decision,) = fxgraph_patch("2.10.1+cpu").decisions
    assert (decision.setting, decision.value, decision.passed) == (f"env.{FXGRAPH_PATCH_ENV}", "1", True)
    (installed,) = fxgraph_patch(torch.__version__).decisions
    assert installed.value == ("1" if needs_fxgraph_pickle_patch(torch.__version__) else "0")
    assert torch.__version__ in installed.reason


@pytest.mark.parametrize(
    ("version", "needed"), [("2.10.0", True), ("2.10.1+cpu", True), ("2.1.0", False), ("2.11.0", False), ("x", False)]
)
def test_version_gate(version, needed):
    assert needs_fxgraph_pickle_patch(version) is needed


def test_vllm_backport_does_not_stack_on_ours_in_either_order():
    """The real vLLM backport (vllm/env_override.py) and ours: one wrapper whichever runs first.

    In a subprocess: importing vLLM applies its other torch overrides process-wide."""
    script = textwrap.dedent(
        """
        from torch._inductor.codecache import BypassFxGraphCache as B, FxGraphCachePickler as P
        from vllm.env_override import _apply_fxgraphcache_pickle_patch as vllm_patch
        from service.in_vllm.fx_graph_cache_patch import apply_fxgraph_pickle_patch, PatchStatus

        original = P.dumps
        assert apply_fxgraph_pickle_patch(True).status is PatchStatus.APPLIED
        ours = P.dumps
        vllm_patch(P, B)
        assert P.dumps is ours and ours.__wrapped__ is original, "vLLM stacked on ours"

        P.dumps = original
        del P._cpu_llm_service_fxgraph_dumps_patched
        vllm_patch(P, B)
        theirs = P.dumps
        assert apply_fxgraph_pickle_patch(True).status is PatchStatus.PATCHED_BY_VLLM
        assert P.dumps is theirs, "we stacked on vLLM"
        print("ok")
        """
    )
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")
