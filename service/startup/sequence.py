"""The start-up sequence before the engine starts, in the order it must run: what refuses a start at once (the cache
dir, access), the kernels' build, the model (fetched while the server answers the port), the report, the
calibration, the service's own preload, and the report logged. The server (server/run.py) binds the port between
deciding and preparing the model, so a port in use refuses the start before minutes of conversion.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
from collections.abc import MutableMapping

from rich.console import Console

from service.cache.permissions import cache_dir_problem, code_dirs
from service.facts.api_key import api_key_of
from service.facts.software import GGML_KERNEL_DIR, KERNEL_SOURCE
from service.kernels.build_at_start import build_at_start
from service.policy.exposure.access import plan_access
from service.settings import Settings
from service.startup import apply, build_report, calibrated_report, fetch_model, prepare_model
from service.startup.download_port import download_status
from service.startup.model_sources import ModelChoice, choose_model, downloads
from service.startup.report import StartupReport
from service.startup.self_preload import preload_self

log = logging.getLogger("service")


class StartRefused(Exception):
    """A start the service refuses; the message says why."""


def refuse_unsafe(settings: Settings) -> None:
    """The checks before anything is read or built (one model's start and a model table's): a cache dir the service
    may not write into its code, and a deployment that forgot its key stays closed."""
    if (problem := cache_dir_problem(settings.cache_dir, code_dirs(GGML_KERNEL_DIR.parent))) is not None:
        raise StartRefused(problem)
    access = plan_access(settings.host, api_key_of(settings), settings.allow_unauthenticated, settings.allowed_hosts)
    if access.errors:
        raise StartRefused("; ".join(access.errors))


def listen(host: str, port: int) -> socket.socket:
    """The service's address, taken by the startup: for the probes while a model downloads, then for the server."""
    try:
        return _bind(host, port)
    except OSError as exc:
        raise StartRefused(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc


def _bind(host: str, port: int) -> socket.socket:
    """The server's address, taken before the engine loads: a port in use refuses the start at once (uvicorn
    binds only when it starts serving; the engine, started beside it, then loaded for a minute and the process
    exited 3, as if the engine had died). Not listening yet: until uvicorn serves, connections are refused, not
    left waiting in the backlog."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart may find TIME_WAIT sockets
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def _fetch(settings: Settings, choice: ModelChoice) -> ModelChoice:
    """The model downloaded while the port answers /health 200 and /ready 503 with the download's progress."""
    early = listen(settings.host, settings.port)
    log.info("fetching %s: the port answers the probes meanwhile", choice.location)
    with download_status(early) as progress:
        return fetch_model(choice, settings, download=True, progress=progress)


def decide_start(settings: Settings, reexecuted: bool, user_preload: str | None) -> tuple[StartupReport, ModelChoice]:
    """Everything the service decides before it binds its port; raises StartRefused."""
    refuse_unsafe(settings)
    # Before the facts are read: they find the build this makes (an image's first start on a CPU).
    build_at_start(settings.build_kernels, KERNEL_SOURCE)  # logs what it did
    choice = choose_model(settings, build_demo=True)
    if downloads(choice):  # a first start may download for minutes: the port says so meanwhile
        choice = _fetch(settings, choice)
    try:
        report = build_report(settings, model=choice)
    except (OSError, ValueError) as exc:  # a cgroup or sysfs file that does not parse: `detect` says the same
        raise StartRefused(f"cannot read the hardware facts: {exc}") from exc
    if report.ok:
        # Calibrated before the re-execution: a verdict can change the backend, and with it the preload. The
        # re-executed process reads the stored timings (even under force: the first process has just timed).
        mode = "auto" if reexecuted and settings.calibrate == "force" else settings.calibrate
        try:
            report = calibrated_report(report, settings, choice, mode)
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            log.warning("calibration failed, the built-in table decides: %s", exc)
        if report.ok:
            preload_self(report.plan.env.get("LD_PRELOAD"), user_preload, reexecuted)
    if choice.demo:
        log.warning(
            "DEMO MODEL: serving the built-in tiny random-weight model %r from %s. It answers gibberish; leave "
            "SERVICE_MODEL unset for the default model (SmolLM2-135M-Instruct) or set it to a real one.",
            choice.name,
            choice.location,
        )
    _log_report(report)
    if not report.ok:
        raise StartRefused("; ".join(report.errors))
    return report, choice


# The hub's tokens: the model is fetched by now, and vLLM's processes (which load the model from its local copy) and
# every child they start would otherwise carry them.
HUB_TOKENS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


def prepare(report: StartupReport, gguf_check: bool, environ: MutableMapping[str, str] = os.environ) -> str:
    """The decisions applied to this process, and the model the engine loads (converted if need be); raises
    StartRefused."""
    apply(report, environ)
    if dropped := [name for name in HUB_TOKENS if environ.pop(name, None) is not None]:
        log.info("%s removed from the environment the engine's processes inherit: the model is fetched", dropped)
    try:
        return prepare_model(report, gguf_check=gguf_check)
    except Exception as exc:  # a conversion that failed leaves nothing in the cache (service/models/gguf_convert.py)
        raise StartRefused(str(exc)) from exc


def _log_report(report: StartupReport) -> None:
    console = Console(stderr=True, width=160)
    report.render(console)
    log.info("startup report %s", json.dumps(report.to_dict()))
