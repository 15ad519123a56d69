"""CLI: `python -m service serve | detect | pull | launch` (the benchmark is a tool beside it: `python -m bench`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from service.policy.machine.backends import ORDER
from service.startup.model_sources import forms

app = typer.Typer(add_completion=False, no_args_is_help=True, help="CPU LLM inference service")

ConfigOpt = Annotated[Path | None, typer.Option("--config", help="Settings YAML (default configs/default.yaml)")]
ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        help=forms(),
    ),
]
BackendOpt = Annotated[str | None, typer.Option("--backend", help="auto | " + " | ".join(ORDER))]
DtypeOpt = Annotated[str | None, typer.Option("--dtype", help="auto | bfloat16 | float16 | float32")]
MaxLenOpt = Annotated[int | None, typer.Option("--max-model-len")]
TpOpt = Annotated[int | None, typer.Option("--tensor-parallel-size")]
ReservedOpt = Annotated[int | None, typer.Option("--reserved-cpus")]
KvDtypeOpt = Annotated[str | None, typer.Option("--kv-cache-dtype", help="auto | fp8 | fp8_e4m3 | fp8_e5m2")]


def _settings(config: Path | None, **flags: Any):
    from service.settings import load_settings

    try:
        return load_settings(config, **flags)
    except (ValueError, FileNotFoundError) as exc:
        typer.echo(f"invalid settings: {exc}", err=True)
        raise typer.Exit(2) from exc


@app.command()
def detect(
    model: ModelOpt = None,
    cpuinfo: Annotated[Path | None, typer.Option("--cpuinfo", help="A recorded /proc/cpuinfo")] = None,
    sysfs: Annotated[Path | None, typer.Option("--sysfs", help="A recorded tree laid out like /sys")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON")] = False,
    calibrate: Annotated[
        bool, typer.Option("--calibrate", help="Time the open speed decisions here (or reuse the stored timings)")
    ] = False,
    config: ConfigOpt = None,
    backend: BackendOpt = None,
    dtype: DtypeOpt = None,
    max_model_len: MaxLenOpt = None,
    tensor_parallel_size: TpOpt = None,
    reserved_cpus: ReservedOpt = None,
    kv_cache_dtype: KvDtypeOpt = None,
    models: Annotated[
        bool, typer.Option("--models", help="Plan every model of the `models` table together (each in its share)")
    ] = False,
) -> None:
    """Print what the service would decide on this machine (or a recorded dump); exit 1 when it cannot run."""
    from service.startup import build_report, calibrated_report, fetch_model
    from service.startup.model_sources import choose_model

    settings = _settings(
        config,
        model=model,
        backend=backend,
        dtype=dtype,
        max_model_len=max_model_len,
        tensor_parallel_size=tensor_parallel_size,
        reserved_cpus=reserved_cpus,
        kv_cache_dtype=kv_cache_dtype,
    )
    if models or settings.models:
        _detect_table(settings, cpuinfo, sysfs, as_json)
    choice = fetch_model(choose_model(settings, build_demo=False), settings, download=False)
    try:
        report = build_report(settings, model=choice, cpuinfo=cpuinfo, sysfs=sysfs)
    except (OSError, ValueError) as exc:
        typer.echo(f"cannot read the hardware facts: {exc}", err=True)
        raise typer.Exit(2) from exc
    # What a start would use: stored timings of this machine (`cached`), timed now with --calibrate. A recorded
    # dump describes another machine, whose timings this one cannot take.
    if calibrate and (cpuinfo or sysfs):
        typer.echo("--calibrate times this machine: it does not go with a recorded --cpuinfo / --sysfs", err=True)
        raise typer.Exit(2)
    mode = "off" if settings.calibrate == "off" or cpuinfo or sysfs else "cached"
    if calibrate and mode != "off":
        import logging
        import sys

        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
        mode = "force" if settings.calibrate == "force" else "auto"
    try:
        report = calibrated_report(report, settings, choice, mode)
    except (OSError, RuntimeError) as exc:
        typer.echo(f"calibration failed: {exc}", err=True)
        raise typer.Exit(2) from exc
    _shown(report, as_json)


def _shown(report: Any, as_json: bool) -> None:
    """A report (one model's, or a table's) as JSON or rendered; exit 1 when it cannot run."""
    if as_json:
        typer.echo(report.to_json())
    else:
        report.render(Console())
    raise typer.Exit(0 if report.ok else 1)


def _detect_table(settings: Any, cpuinfo: Path | None, sysfs: Path | None, as_json: bool) -> None:
    """detect for a `models` table: each model planned in its share of the memory, then the table's verdict."""
    from service.startup.table_report import plan_table

    if not settings.models:
        typer.echo("--models: no models table (models in a config file, or SERVICE_MODELS as JSON)", err=True)
        raise typer.Exit(2)
    try:
        table = plan_table(settings, cpuinfo, sysfs)
    except (OSError, ValueError) as exc:
        typer.echo(f"cannot read the hardware facts: {exc}", err=True)
        raise typer.Exit(2) from exc
    _shown(table, as_json)


@app.command()
def serve(
    config: ConfigOpt = None,
    model: ModelOpt = None,
    served_model_name: Annotated[str | None, typer.Option("--served-model-name")] = None,
    host: Annotated[str | None, typer.Option("--host")] = None,
    port: Annotated[int | None, typer.Option("--port")] = None,
    api_key_file: Annotated[Path | None, typer.Option("--api-key-file")] = None,
    backend: BackendOpt = None,
    dtype: DtypeOpt = None,
    max_model_len: MaxLenOpt = None,
    tensor_parallel_size: TpOpt = None,
    reserved_cpus: ReservedOpt = None,
    kv_cache_dtype: KvDtypeOpt = None,
    enforce_eager: Annotated[bool | None, typer.Option("--enforce-eager/--no-enforce-eager")] = None,
    lora_adapter: Annotated[
        list[str] | None, typer.Option("--lora-adapter", help="name=path of a LoRA adapter to serve (repeatable)")
    ] = None,
    lora_dir: Annotated[
        Path | None, typer.Option("--lora-dir", help="directory of LoRA adapters that may be loaded while serving")
    ] = None,
) -> None:
    """Run the OpenAI-compatible server (API key: SERVICE_API_KEY or --api-key-file, never a flag)."""
    from service.in_vllm.worker_start import keep_process_titles

    keep_process_titles()
    from service.server.run import run

    settings = _settings(
        config,
        model=model,
        served_model_name=served_model_name,
        host=host,
        port=port,
        api_key_file=api_key_file,
        backend=backend,
        dtype=dtype,
        max_model_len=max_model_len,
        tensor_parallel_size=tensor_parallel_size,
        reserved_cpus=reserved_cpus,
        kv_cache_dtype=kv_cache_dtype,
        enforce_eager=enforce_eager,
        lora_adapters=lora_adapter or None,
        lora_dir=lora_dir,
    )
    raise typer.Exit(run(settings))


@app.command()
def pull(
    model: Annotated[
        str | None,
        typer.Argument(
            help=f"{forms()}. Prints the path it is served from (a draft model's directory, for speculative=); "
            "default: the model setting"
        ),
    ] = None,
    config: ConfigOpt = None,
) -> None:
    """Fetch a model and convert it ahead of time (an image build step, an init container), with the start's checks;
    exit 1 with the reason when the service would refuse it. With a `models` table and no model named: every listed
    model, each as its engine will take it."""
    import logging

    # What it fetches is checked as a model of its own: a draft directory the speculative setting names may be the
    # very model being pulled, not there yet.
    settings = _settings(config, model=model, speculative="off")
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("service").setLevel(settings.log_level.upper())
    own = [settings.for_listed(entry) for entry in settings.models] if settings.models else [settings]
    refused = [problem for one in own if (problem := _pull_one(one))]
    if refused:
        raise typer.Exit(1)


def _pull_one(settings: Any) -> str | None:
    """Fetches, checks and prepares one model; why it was refused (said on stderr), else None."""
    from service.startup import build_report, fetch_model, prepare_model
    from service.startup.model_sources import choose_model

    choice = fetch_model(choose_model(settings, build_demo=True), settings, download=True)
    report = build_report(settings, model=choice)
    name = settings.served_model_name or choice.name or choice.location
    if not report.ok:
        problem = "; ".join(report.errors)
        typer.echo(f"refused: {name}: {problem}", err=True)
        return problem
    try:
        engine_model = prepare_model(report, gguf_check=settings.gguf_check != "off")
    except Exception as exc:  # a conversion that failed leaves nothing in the cache (service/models/gguf_convert.py)
        typer.echo(f"refused: {name}: {exc}", err=True)
        return str(exc)
    typer.echo(f"ready: {name} -> {engine_model}" + (f" ({choice.fetched})" if choice.fetched else ""))
    return None


@app.command()
def launch(
    client: Annotated[str, typer.Argument(help="claude (Claude Code) | codex (Codex CLI)")],
    args: Annotated[list[str] | None, typer.Argument(help="The client's own arguments, after --")] = None,
    client_path: Annotated[
        Path | None,
        typer.Option(
            "--client-path", help="The client's executable (default: on PATH, else the one make agent-clients installs)"
        ),
    ] = None,
    config: ConfigOpt = None,
) -> None:
    """Run Claude Code or Codex CLI against the running service (its address and key from the settings, its model
    and context from GET /v1/models); says on stderr what it set, then the client takes over."""
    import os

    from service.launch import CLIENTS, LaunchError, fetch_models, find_client, prepare

    if client not in CLIENTS:
        typer.echo(f"unknown client {client!r}: one of {', '.join(CLIENTS)}", err=True)
        raise typer.Exit(2)
    settings = _settings(config)
    try:
        binary = find_client(client, client_path)
        launched = prepare(client, settings, fetch_models(settings), os.environ)
    except LaunchError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from exc
    for path, text in launched.files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for line in [*launched.said, f"running {binary} {' '.join(args or [])}"]:
        typer.echo(line, err=True)
    os.execve(binary, [str(binary), *(args or [])], launched.env)


if __name__ == "__main__":
    app()
