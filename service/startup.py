"""The startup hook: facts -> policy -> report; then (serve only) apply the environment before vLLM spawns."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from service.facts.hardware import read_hardware
from service.facts.libraries import read_libraries
from service.facts.model import ModelFacts, ModelNotFound, inspect_model
from service.facts.software import read_software
from service.patches import PATCH_ENV, needs_fxgraph_pickle_patch
from service.policy.decision import Decision
from service.policy.engine import build_plan
from service.report import StartupReport
from service.settings import Settings

log = logging.getLogger("service.startup")


def build_report(
    settings: Settings,
    *,
    model: str | None,
    cpuinfo: Path | None = None,
    sysfs: Path | None = None,
    environ: Mapping[str, str] = os.environ,
) -> StartupReport:
    """Pure of side effects: reads the machine (or a recorded dump) and the model's config, decides."""
    hardware = read_hardware(cpuinfo, sysfs)
    software = read_software()
    model_facts: ModelFacts | None = None
    model_error: str | None = None
    if model:
        try:
            model_facts = inspect_model(model)
        except (ModelNotFound, OSError, ValueError) as exc:
            model_error = f"model {model!r}: {exc}"
    plan = build_plan(hardware, model_facts, software, settings, environ, read_libraries())
    if model_error:
        plan = dataclasses.replace(plan, errors=plan.errors + (model_error,))
    return StartupReport(
        hardware=hardware,
        software=software,
        model=model_facts,
        plan=plan,
        extra_decisions=(fxgraph_patch_decision(software.torch),),
    )


PATCH_SETTING = "patch.torch_fxgraph_pickle"


def fxgraph_patch_decision(torch_version: str | None) -> Decision:
    needed = torch_version is not None and needs_fxgraph_pickle_patch(torch_version)
    reason = (
        f"torch {torch_version}: FxGraphCachePickler.dumps turns a ValueError into BypassFxGraphCache"
        if needed
        else f"not needed on torch {torch_version}: only 2.10.x lacks the fix"
    )
    carried = f"; carried to every vLLM process in {PATCH_ENV}, applied there by the service's vLLM plugin"
    return Decision(PATCH_SETTING, needed, reason + carried, "policy")


def apply(report: StartupReport, environ: MutableMapping[str, str] = os.environ) -> None:
    """Set the decided environment in this process before vLLM starts: vLLM's API server code in this process,
    its engine core and workers (which inherit it) all read their platform and the torch patch decision from it
    through the service's vLLM plugins (service/vllm_plugin.py)."""
    if not report.ok:
        raise RuntimeError("refusing to start: " + "; ".join(report.errors))
    environ.update(report.plan.env)
    patch = next(d for d in report.decisions if d.setting == PATCH_SETTING)
    environ[PATCH_ENV] = "1" if patch.value else "0"
    backend = report.plan.backend
    log.info("vLLM platform %s for backend %s: %s", backend.platform, backend.name, backend.reason)
