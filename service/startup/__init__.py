"""The startup hook: which model (fetched from the hub or found in Ollama's store) -> facts -> policy -> report; then
(serve only) apply the environment and prepare the model (build the demo, convert a GGUF file) before vLLM spawns."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Literal

from service.facts.draft_model import read_draft
from service.facts.hardware import HardwareFacts, read_hardware
from service.facts.libraries import read_libraries
from service.facts.model import (
    ModelFacts,
    ModelNotFound,
    inspect_model,
)
from service.facts.software import read_software
from service.facts.vllm_source import read_vllm_names
from service.in_vllm.contract import THREADS_BIND_ENV
from service.models.hub_download import parse_hub_id
from service.policy.engine.model_table import memory_share
from service.policy.engine.speculative import draft_directory
from service.policy.gguf.gguf_architectures import architecture_problem
from service.policy.machine.table_cpus import CpuPlan, plan_table_cpus
from service.policy.plan.calibration import Mode, Verdict
from service.policy.plan.decision import record
from service.policy.plan.plan import plan_engine
from service.policy.plan.plan_state import PlanInputs
from service.settings import USER_SOURCES, Settings
from service.startup.model_sources import ModelChoice
from service.startup.report import StartupReport

log = logging.getLogger("service.startup")


def fetch_model(
    choice: ModelChoice,
    settings: Settings,
    *,
    download: bool,
    progress: Callable[[str], None] = lambda line: None,
) -> ModelChoice:
    """A Hugging Face id that is not a path: its snapshot (or, with a :TAG, its GGUF file) in the HF cache, downloaded
    first when `download` (serve, pull; not detect), settings.download is auto and HF_HUB_OFFLINE is unset. A
    checkpoint is pre-flighted on its metadata (the report this start would build) before its weights come;
    `progress` gets the download's progress lines."""
    from huggingface_hub import constants

    from service.models.hub_download import DownloadRefused, fetch

    asked = choice.location
    spec = parse_hub_id(asked) if choice.hub and asked else None
    if spec is None:
        return choice
    online = download and settings.download == "auto" and not constants.HF_HUB_OFFLINE

    def preflight(directory: Path, weight_bytes: int) -> list[str]:
        probe = dataclasses.replace(choice, location=str(directory), name=asked, weight_bytes=weight_bytes)
        return list(build_report(settings, model=probe).errors)

    def gguf_check(architecture: str) -> str | None:
        return architecture_problem(architecture, settings.gguf_unchecked == "serve")[0]

    cache = Path(constants.HF_HUB_CACHE)
    try:
        fetched = fetch(spec, cache, preflight, offline=not online, gguf_check=gguf_check, progress=progress)
    except DownloadRefused as exc:
        return ModelChoice("configured", None, f"model {asked!r}: {exc}", name=asked)
    except Exception as exc:  # the hub unreachable, a repo or revision it does not have, a gated repo: said as is
        if not online:
            raise
        log.warning("could not reach the hub for %s (%s): looking in the cache", asked, exc)
        try:
            fetched = fetch(spec, cache, preflight, offline=True)
        except DownloadRefused:
            return ModelChoice("configured", None, f"model {asked!r}: {type(exc).__name__}: {exc}", name=asked)
    log.info("model %s: %s (%s)", asked, fetched.path, fetched.why)
    return ModelChoice("configured", str(fetched.path), name=asked, fetched=fetched.why)


def build_report(
    settings: Settings,
    *,
    model: ModelChoice | None,
    cpuinfo: Path | None = None,
    sysfs: Path | None = None,
    environ: Mapping[str, str] = os.environ,
    verdicts: Mapping[str, Verdict] | None = None,
    engines: int | None = None,
) -> StartupReport:
    """Reads the machine (or a recorded dump) and the model's config, decides. Its one side effect: a GGUF file's
    facts are kept under the cache dir for the next start. `model` None: the machine alone. `engines`: how many
    engines of a model table share the machine's memory (policy/engine/model_table.py); None: no table."""
    hardware = read_hardware(cpuinfo, sysfs)
    limits, share = memory_share(hardware.limits, engines or 1)
    hardware = dataclasses.replace(hardware, limits=limits)
    software = read_software()
    model_facts: ModelFacts | None = None
    model_error = model.error if model else None
    if model and model.location:
        try:
            model_facts = inspect_model(
                model.location,
                cache_dir=settings.cache_dir,
                chat_template=settings.chat_template,
                lora_adapters=settings.lora_adapters,
            )
        except (ModelNotFound, OSError, ValueError) as exc:
            model_error = f"model {model.location!r}: {exc}"
        if model_facts is not None and model.weight_bytes and not model_facts.weight_bytes:
            # the hub's figure, where only the metadata is here yet (a single safetensors file has no index)
            model_facts = dataclasses.replace(model_facts, weight_bytes=model.weight_bytes)
        if model_facts is not None and model.digest:
            model_error = _digest_problem(model, model_facts) or model_error
    plan = plan_engine(
        PlanInputs(
            hardware,
            model_facts,
            software,
            settings,
            environ,
            read_libraries(),
            read_vllm_names(),
            model.name if model else None,
            model is not None and model.kind == "default",
            verdicts,
            read_draft(directory) if (directory := draft_directory(settings.speculative)) else None,
        )
    )
    if model_error:
        plan = dataclasses.replace(plan, errors=plan.errors + (model_error,))
    if model and model.fetched and model.location:
        fetched = record("model", "fetched", model.location, model.fetched, "user")
        plan = dataclasses.replace(plan, decisions=(fetched, *plan.decisions))
    if engines is not None:
        cpus = table_cpus(settings, hardware, engines, environ)
        plan = dataclasses.replace(
            plan,
            decisions=(share, cpus.decision, *plan.decisions),
            errors=plan.errors + ((cpus.error,) if cpus.error else ()),
        )
    return StartupReport(hardware=hardware, software=software, model=model_facts, plan=plan)


def table_cpus(
    settings: Settings, hardware: HardwareFacts, engines: int, environ: Mapping[str, str] = os.environ
) -> CpuPlan:
    """The CPUs of a model table's engines loaded at once (policy/machine/table_cpus.py)."""
    source = "user" if settings.source_of("model_cpus") in USER_SOURCES else "policy"
    bind = environ.get(THREADS_BIND_ENV)
    return plan_table_cpus(settings.model_cpus, source, hardware.topology, hardware.limits, engines, bind)


def _digest_problem(choice: ModelChoice, facts: ModelFacts) -> str | None:
    """An Ollama blob against its manifest's digest, with the sha256 its GGUF facts carry: hashed once per version of
    the file and kept under the cache dir (service/facts/gguf_cache.py), not hashed again at every start."""
    found = facts.gguf.sha256 if facts.gguf else None
    if found == choice.digest:
        return None
    return (
        f"model {choice.name}: the blob {choice.location} has the sha256 {found}, and Ollama's manifest names "
        f"sha256:{choice.digest}: it is not the file Ollama pulled; `ollama pull {choice.name}` again"
    )


def calibrated_report(
    report: StartupReport,
    settings: Settings,
    model: ModelChoice,
    mode: Mode | Literal["cached"],
    cpuinfo: Path | None = None,
    sysfs: Path | None = None,
) -> StartupReport:
    """The report decided again with the calibration's verdicts (service/startup/calibration_run.py), when it has questions."""
    from service.startup.calibration_run import calibrate

    verdicts = calibrate(report, settings.cache_dir, mode)
    if not verdicts:
        return report
    return build_report(settings, model=model, cpuinfo=cpuinfo, sysfs=sysfs, verdicts=verdicts)


def apply(report: StartupReport, environ: MutableMapping[str, str] = os.environ) -> None:
    """Set the decided environment in this process before vLLM starts: vLLM's API server code in this process,
    its engine core and workers (which inherit it) all read their platform and the torch patch decision from it
    through the service's vLLM plugins (service/in_vllm/plugin.py)."""
    if not report.ok:
        raise RuntimeError("refusing to start: " + "; ".join(report.errors))
    environ.update(report.plan.env)
    backend = report.plan.backend
    log.info("vLLM platform %s for backend %s: %s", backend.platform, backend.name, backend.reason)


def prepare_model(report: StartupReport, *, gguf_check: bool) -> str:
    """What the engine loads, made ready: a GGUF file's converted copy (converted now when the cache lacks it), with
    llama.cpp's scores the engine is checked against where `gguf_check` (the setting is not off)."""
    source = report.plan.model
    if source is None:
        raise RuntimeError("no model in the startup report")
    if source.conversion is None:
        return source.engine_model
    from service.models.gguf_convert import ensure_converted
    from service.models.llama_cpp_reference import ensure_reference

    converted = ensure_converted(source.conversion)
    if gguf_check:
        ensure_reference(Path(source.conversion.source), converted)
    return str(converted)
