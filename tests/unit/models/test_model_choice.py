"""Which model the service runs, under which name, and the default model's dtype (startup -> policy); a reference
read as a path or as a hub id, never one taken for the other."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from service.facts.cpu import parse_cpuinfo
from service.facts.model import packaged_default_model_path
from service.models.demo_model import DEMO_NAME, ensure_demo_model
from service.policy.engine.dtype import DEFAULT_MODEL_FP32, choose_dtype
from service.policy.machine.backends import BACKENDS
from service.settings import Settings
from service.startup import build_report, fetch_model
from service.startup.model_sources import NO_DEFAULT_MODEL, choose_model, downloads
from tests.support.gguf_models import tiny_gguf
from tests.support.ollama_store import ollama_store
from tests.support.server import MODELS
from tests.unit.models.test_hub_download import checkpoint

CPUINFO = Path(__file__).resolve().parents[2] / "fixtures" / "cpuinfo"


def _decision(report, setting):
    return next(d for d in report.decisions if d.setting == setting)


def test_no_model_configured_is_the_packaged_smollm2(tmp_path):
    settings = Settings(cache_dir=tmp_path)
    choice = choose_model(settings, build_demo=False)
    assert choice.kind == "default" and choice.location == str(packaged_default_model_path())
    report = build_report(settings, model=choice)
    assert report.ok, report.errors
    assert report.plan.model.served_name == "SmolLM2-135M-Instruct"
    assert report.plan.model.conversion.dtype == report.plan.engine_args["dtype"] == "float32"
    assert _decision(report, "engine.dtype").reason == DEFAULT_MODEL_FP32
    assert _decision(report, "model.source").value == report.plan.model.engine_model


def test_without_the_default_models_wheel_the_report_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setattr("service.startup.model_sources.packaged_default_model_path", lambda: None)
    settings = Settings(cache_dir=tmp_path)
    report = build_report(settings, model=choose_model(settings, build_demo=False))
    assert NO_DEFAULT_MODEL in report.errors and "make setup" in NO_DEFAULT_MODEL


@pytest.mark.parametrize("cpu", ["epyc_9755_zen5.txt", "xeon_8480_sapphirerapids.txt", "epyc_zen1_kvm_avx2.txt"])
def test_the_default_model_runs_fp32_on_every_cpu_unless_the_user_asks_otherwise(cpu):
    isa = parse_cpuinfo((CPUINFO / cpu).read_text()).isa
    backend = BACKENDS["avx512" if isa.avx512 else "avx2"]

    def dtype(*args, **kwargs) -> str:
        return choose_dtype(isa, backend, *args, **kwargs).engine_args["dtype"]

    assert dtype("auto", "float32", None, default_model=True) == "float32"
    assert dtype("bfloat16", "float32", None, default_model=True) == "bfloat16"
    # Where fp32 cannot run (its kernels, its memory), the speed policy's choice stands.
    assert dtype("auto", "float32", "fp32 does not fit", default_model=True) == dtype("auto", "float32", "x")


def test_the_demo_is_asked_for_by_name_and_served_under_it(tmp_path):
    settings = Settings(model=DEMO_NAME, cache_dir=tmp_path)
    assert choose_model(settings, build_demo=False).location is None  # detect never builds it
    ensure_demo_model(tmp_path)
    choice = choose_model(settings, build_demo=False)
    assert choice.demo and choice.location
    report = build_report(settings, model=choice)
    assert report.plan.model.served_name == DEMO_NAME and report.plan.model.conversion is None


def test_served_names_of_a_gguf_file_a_directory_and_a_user_choice(tmp_path):
    gguf = tmp_path / "Qwen3-Tiny-Q8_0.gguf"
    gguf.symlink_to(tiny_gguf(MODELS, "qwen3", "Q8_0"))
    settings = Settings(model=str(gguf), cache_dir=tmp_path)
    report = build_report(settings, model=choose_model(settings, build_demo=False))
    assert report.plan.model.served_name == "Qwen3-Tiny"  # llama.cpp's quantization suffix dropped
    named = Settings(model=str(gguf), cache_dir=tmp_path, served_model_name="mine")
    assert build_report(named, model=choose_model(named, build_demo=False)).plan.model.served_name == "mine"
    demo = ensure_demo_model(MODELS)
    as_dir = Settings(model=str(demo))
    assert build_report(as_dir, model=choose_model(as_dir, build_demo=False)).plan.model.served_name == demo.name


def test_a_directory_with_a_truncated_shard_is_refused_naming_it(tmp_path):
    """The engine would load for a minute and die (exit 3, the error deep in a worker's traceback); the report
    refuses it first (exit 2 from serve), naming the shard and both sizes."""
    demo = ensure_demo_model(MODELS)
    copy = shutil.copytree(demo, tmp_path / "copy")
    shard = next(copy.glob("*.safetensors"))
    os.truncate(shard, shard.stat().st_size // 2)
    settings = Settings(model=str(copy), cache_dir=tmp_path)
    report = build_report(settings, model=choose_model(settings, build_demo=False))
    assert not report.ok
    (error,) = report.errors
    assert f"the weights in {copy} cannot be loaded: {shard.name} is truncated" in error, error
    intact = Settings(model=str(demo), cache_dir=tmp_path)
    assert build_report(intact, model=choose_model(intact, build_demo=False)).ok


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """A working directory and a home of the test's own: where relative paths and `~` lead."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return work


def chosen(reference: str, cache_dir: Path, download: bool = True):
    settings = Settings(model=reference, cache_dir=cache_dir)
    return fetch_model(choose_model(settings, build_demo=False), settings, download=download)


@pytest.mark.parametrize("reference", ["./tiny", "../tiny", "./acme/tiny", "~/acme/tiny", "{tmp}/acme/tiny", "tiny"])
def test_a_path_that_does_not_exist_is_an_error_never_a_download(hub, tmp_path, workdir, reference):
    for repo in ("acme/tiny", "tiny/tiny"):
        checkpoint(hub.root, repo)
    choice = chosen(reference.format(tmp=tmp_path), tmp_path / "cache")
    assert choice.location is None and not downloads(choice)
    assert "does not exist (a path is never downloaded)" in choice.error and "hf:org/name" in choice.error
    assert hub.requests == []


def test_a_hub_id_whose_org_is_a_folder_here_is_refused_with_both_readings(hub, tmp_path, workdir):
    """SERVICE_MODEL=models/qwen with the volume not mounted: its mount point is there, empty."""
    checkpoint(hub.root, "models/qwen")  # whoever owns that name on the hub
    (workdir / "models").mkdir()
    choice = chosen("models/qwen", tmp_path / "cache")
    assert choice.location is None and hub.requests == []
    assert f"the path {workdir / 'models/qwen'}, which does not exist" in choice.error
    assert "write ./models/qwen for the path, hf:models/qwen for the hub" in choice.error


def test_hf_makes_it_a_hub_id_even_where_a_path_of_that_name_exists(hub, tmp_path, workdir):
    d = hub.root / "acme/m-GGUF"
    d.mkdir(parents=True)
    (d / "m-Q8_0.gguf").write_bytes(b"GGUF" + b"Q8_0" * 5_000)
    (workdir / "acme/m-GGUF@main:Q8_0").mkdir(parents=True)
    assert chosen("acme/m-GGUF@main:Q8_0", tmp_path / "cache", download=False).location == "acme/m-GGUF@main:Q8_0"
    assert hub.requests == []  # an existing path is a path
    choice = chosen("hf:acme/m-GGUF@main:Q8_0", tmp_path / "cache")
    assert Path(choice.location).read_bytes() == (d / "m-Q8_0.gguf").read_bytes()
    assert choice.name == "acme/m-GGUF@main:Q8_0" and "downloaded from acme/m-GGUF@" in choice.fetched
    refused = chosen("hf:../m-GGUF", tmp_path / "cache")
    assert refused.location is None and "not a Hugging Face id (hf:org/name[@revision][:TAG])" in refused.error


def test_an_ollama_blob_whose_content_is_not_its_digest_is_refused_naming_both(tmp_path, monkeypatch):
    """The blob's sha256 is the one its GGUF facts carry, kept between starts: not hashed again to check it."""
    store = tmp_path / "ollama"
    blob = ollama_store(store, "tiny", "q8", tiny_gguf(MODELS, "qwen3", "Q8_0").read_bytes())
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    settings = Settings(model="ollama:tiny:q8", cache_dir=tmp_path / "cache")
    digest = blob.name.removeprefix("sha256-")
    assert not [e for e in build_report(settings, model=choose_model(settings, build_demo=False)).errors if digest in e]
    other = tiny_gguf(MODELS, "llama", "Q8_0")
    blob.write_bytes(other.read_bytes())
    report = build_report(settings, model=choose_model(settings, build_demo=False))
    found = hashlib.sha256(other.read_bytes()).hexdigest()
    (error,) = [e for e in report.errors if digest in e]
    assert f"has the sha256 {found}" in error and f"names sha256:{digest}" in error and "ollama pull tiny:q8" in error
    monkeypatch.setattr("service.facts.gguf._sha256", lambda path: pytest.fail("hashed again"))
    assert [e for e in build_report(settings, model=choose_model(settings, build_demo=False)).errors if digest in e]


def test_every_model_source_is_in_the_help_and_in_the_settings_description():
    """The registry names each source once for the CLI's help; the setting's own description (settings.py, below the
    startup) must say the same forms."""
    from service.settings import Settings as S
    from service.startup.model_sources import SOURCES, forms

    assert all(s.forms in forms() for s in SOURCES) and forms().startswith("model directory or GGUF file")
    description = S.model_fields["model"].description or ""
    for token in ("demo-tiny-llama", "ollama:NAME[:TAG]", "hf:org/name", "org/name[@revision]", "./x", "empty:"):
        assert token in description and token in forms(), token


def test_the_first_source_that_claims_a_value_resolves_it(tmp_path, monkeypatch):
    from service.startup.model_sources import SOURCES

    monkeypatch.chdir(tmp_path)
    (tmp_path / "org").mkdir()
    (tmp_path / "here.gguf").write_bytes(b"")
    claimed = {
        value: next(s.name for s in SOURCES if s.claims(value))
        for value in (
            "",
            "demo-tiny-llama",
            "ollama:qwen3:0.6b",
            "hf:org/name",
            "./missing",
            "here.gguf",
            "org/name",
            "other/name",
        )
    }
    assert claimed == {
        "": "default",
        "demo-tiny-llama": "demo",
        "ollama:qwen3:0.6b": "ollama",
        "hf:org/name": "hub",
        "./missing": "path",
        "here.gguf": "path",
        "org/name": "hub id",
        "other/name": "hub id",
    }
    settings = Settings(cache_dir=tmp_path / "cache")
    assert "reads two ways" in (
        choose_model(settings.model_copy(update={"model": "org/name"}), build_demo=False).error or ""
    )
    assert choose_model(settings.model_copy(update={"model": "other/name"}), build_demo=False).hub
    assert choose_model(settings.model_copy(update={"model": "hf:org/name"}), build_demo=False).hub


def test_each_model_source_claims_and_resolves_its_example(tmp_path, monkeypatch):
    """A new source's entry is exercised here: the first source claiming its example is itself, and it resolves it
    to a choice (found, or an error saying why not) without fetching anything."""
    from service.startup.model_sources import SOURCES

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    settings = Settings(cache_dir=tmp_path / "cache")
    for source in SOURCES:
        assert next(s for s in SOURCES if s.claims(source.example)) is source, source.name
        choice = source.resolve(source.example, settings, False)
        assert choice.location or choice.error or choice.demo, source.name
        assert choice.hub is source.downloads, source.name
