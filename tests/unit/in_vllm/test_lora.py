"""LoRA adapters: the setting, the facts read from an adapter directory, the policy's engine arguments, and the fix to
vLLM's CPU LoRA ops that every vLLM process applies (service/in_vllm/lora_rows.py)."""

from __future__ import annotations

import inspect
import json
import os
import typing

import pytest
import torch

from service.facts.lora import read_adapter
from service.in_vllm import lora_rows
from service.in_vllm.contract import LORA_ROWS_ENV
from service.policy.engine.lora import LORA_RANKS
from service.server.supervision.engine_start import engine_flags
from service.settings import Settings
from service.startup import build_report
from service.startup.model_sources import choose_model
from tests.support.lora import make_adapter


def _decisions(report):
    return {d.setting: d for d in report.decisions}


@pytest.mark.parametrize(
    "given",
    [
        "sql=/a/sql, chat=/b",
        '{"sql": "/a/sql", "chat": "/b"}',
        ["sql=/a/sql", "chat=/b"],
        {"sql": "/a/sql", "chat": "/b"},
    ],
)
def test_the_setting_takes_vllms_name_path_form_json_or_a_mapping(given):
    adapters = Settings(lora_adapters=given).lora_adapters
    assert {name: str(path) for name, path in adapters.items()} == {"sql": "/a/sql", "chat": "/b"}


def test_the_setting_from_the_environment_and_empty(monkeypatch):
    monkeypatch.setenv("SERVICE_LORA_ADAPTERS", "sql=/a/sql")
    assert Settings().lora_adapters == {"sql": __import__("pathlib").Path("/a/sql")}
    monkeypatch.setenv("SERVICE_LORA_ADAPTERS", "")
    assert Settings().lora_adapters == {}


@pytest.mark.parametrize("given", ["sql", "=/a/sql", ["sql"]])
def test_an_adapter_without_a_name_is_refused(given):
    with pytest.raises(ValueError, match="name=path"):
        Settings(lora_adapters=given)


def test_an_adapter_directory_is_read(tmp_path):
    facts = read_adapter("sql", make_adapter(tmp_path / "sql", seed=0, rank=12))
    assert (facts.name, facts.rank, facts.alpha, facts.weights) == ("sql", 12, 24.0, "adapter_model.safetensors")
    assert facts.target_modules == ("q_proj", "v_proj") and facts.path == str(tmp_path / "sql")


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (lambda d: d.rename(d.with_name("gone")), "is not a directory"),
        (lambda d: (d / "adapter_config.json").unlink(), "has no adapter_config.json"),
        (lambda d: (d / "adapter_config.json").write_text("{r: 8"), "adapter_config.json is not valid JSON"),
        (lambda d: (d / "adapter_config.json").write_text("[8]"), "holds no JSON object"),
        (lambda d: (d / "adapter_config.json").write_text('{"peft_type": "IA3", "r": 8}'), "IA3 adapter"),
        (lambda d: (d / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 0}'), "no rank r"),
        (lambda d: (d / "adapter_model.safetensors").unlink(), "holds none of adapter_model.safetensors"),
        (lambda d: os.truncate(d / "adapter_model.safetensors", 40), "adapter_model.safetensors is truncated"),
        (
            lambda d: (d / "adapter_model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\n"),
            "adapter_model.safetensors is a Git LFS pointer",
        ),
        (
            lambda d: (d / "adapter_model.safetensors").write_bytes((2).to_bytes(8, "little") + b"[]"),
            "adapter_model.safetensors has no readable safetensors header",
        ),
    ],
)
def test_an_adapter_that_cannot_serve_is_named_with_the_reason(tmp_path, spoil, message):
    directory = make_adapter(tmp_path / "sql", seed=0)
    spoil(directory)
    with pytest.raises(ValueError, match=message) as refused:
        read_adapter("sql", directory)
    assert "LoRA adapter 'sql'" in str(refused.value)


def test_an_adapter_path_the_filesystem_cannot_take_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"LoRA adapter 'sql' \(.*\) cannot be read: File name too long"):
        read_adapter("sql", tmp_path / ("x" * 300))


def _as_bin(directory, name="adapter_model.bin"):
    """The adapter's weights as a torch pickle, as older PEFT versions saved them."""
    from safetensors.torch import load_file

    tensors = load_file(str(directory / "adapter_model.safetensors"))
    (directory / "adapter_model.safetensors").unlink()
    torch.save(tensors, directory / name)
    return directory


@pytest.mark.parametrize("name", ["adapter_model.bin", "adapter_model.pt"])
def test_a_torch_pickle_adapters_widths_are_read_without_its_weights(tmp_path, name):
    facts = read_adapter("big", _as_bin(make_adapter(tmp_path / "big", seed=0, width=576, layers=30), name))
    assert (facts.weights, facts.inputs, facts.layers) == (name, (("q_proj", 576), ("v_proj", 576)), 30)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"version https://git-lfs.github.com/spec/v1\n", "adapter_model.bin is no readable torch file"),
        (b"", "adapter_model.bin is no readable torch file"),
    ],
)
def test_an_unreadable_torch_pickle_adapter_is_named(tmp_path, content, message):
    directory = _as_bin(make_adapter(tmp_path / "sql", seed=0))
    (directory / "adapter_model.bin").write_bytes(content)
    with pytest.raises(ValueError, match=message):
        read_adapter("sql", directory)


def test_a_torch_pickle_adapter_for_another_model_refuses_the_start(tmp_path):
    report = _report(tmp_path, demo=_as_bin(make_adapter(tmp_path / "demo", seed=0)))
    assert any("'demo' does not fit the model" in e and "takes 256 inputs" in e for e in report.errors), report.errors


def test_a_torch_pickle_of_no_tensors_is_named(tmp_path):
    directory = _as_bin(make_adapter(tmp_path / "sql", seed=0))
    torch.save([1, 2], directory / "adapter_model.bin")
    with pytest.raises(ValueError, match="holds a list, not a dict of tensors"):
        read_adapter("sql", directory)


def _smollm2_adapter(directory, rank=8):
    """Made for the default model, SmolLM2-135M: 30 layers, 576 wide."""
    return make_adapter(directory, 0, rank=rank, layers=30, width=576)


def _report(tmp_path, lora: dict | None = None, **adapters):
    settings = Settings(cache_dir=tmp_path / "cache", lora_adapters=adapters, **(lora or {}))
    return build_report(settings, model=choose_model(settings, build_demo=False), environ={})


def test_the_policy_sizes_vllms_lora_arguments_from_the_adapters(tmp_path):
    report = _report(tmp_path, sql=_smollm2_adapter(tmp_path / "sql", 8), chat=_smollm2_adapter(tmp_path / "chat", 12))
    assert report.ok, report.errors
    args = report.plan.engine_args
    assert args["enable_lora"] is True and args["max_loras"] == 2
    assert args["max_lora_rank"] == 16, "the smallest rank vLLM allows that holds r=12"
    assert args["lora_modules"] == [
        {"name": "sql", "path": str(tmp_path / "sql")},
        {"name": "chat", "path": str(tmp_path / "chat")},
    ]
    assert report.plan.env[LORA_ROWS_ENV] == "1"
    decided = _decisions(report)
    assert "chat (r=12)" in decided["engine.max_lora_rank"].reason
    assert "without torch.compile" in decided["engine.enforce_eager"].reason
    # vLLM's flags: one --lora-modules with a JSON value per adapter, as its parser takes them.
    flags = engine_flags({"lora_modules": args["lora_modules"]})
    assert flags[0] == "--lora-modules" and [json.loads(f)["name"] for f in flags[1:]] == ["sql", "chat"]


def test_without_adapters_there_is_no_lora_decision(tmp_path):
    report = _report(tmp_path)
    assert report.ok, report.errors
    assert not {"enable_lora", "max_loras", "max_lora_rank", "lora_modules"} & report.plan.engine_args.keys()
    assert LORA_ROWS_ENV not in report.plan.env
    assert "torch.compile" in _decisions(report)["engine.enforce_eager"].reason


@pytest.mark.parametrize(
    ("at_start", "max_rank", "rank", "why"),
    [
        ((), None, 16, "adapters loaded while serving (lora_max_rank, r=16)"),
        ((8,), None, 16, "adapters loaded while serving (lora_max_rank, r=16)"),
        ((8, 64), None, 64, "the widest adapter, a1 (r=64)"),
        ((8,), 40, 64, "adapters loaded while serving (lora_max_rank, r=40)"),
        ((), 4, 8, "adapters loaded while serving (lora_max_rank, r=4)"),
    ],
)
def test_a_lora_dir_adds_one_shared_slot_sized_for_the_adapters_loaded_while_serving(
    tmp_path, at_start, max_rank, rank, why
):
    adapters = {f"a{i}": _smollm2_adapter(tmp_path / f"a{i}", r) for i, r in enumerate(at_start)}
    library = tmp_path / "library"
    library.mkdir()
    lora = {"lora_dir": library, "lora_max_rank": max_rank}
    report = _report(tmp_path, lora, **adapters)
    assert report.ok, report.errors
    args, decided = report.plan.engine_args, _decisions(report)
    assert args["enable_lora"] is True and args["max_loras"] == len(at_start) + 1
    assert args["max_lora_rank"] == rank and why in decided["engine.max_lora_rank"].reason
    assert f"more may be loaded from {library} while serving" in decided["engine.enable_lora"].reason
    assert "share" in decided["engine.max_loras"].reason
    assert ("lora_modules" in args) == bool(at_start)
    assert report.plan.env[LORA_ROWS_ENV] == "1"
    # The memory plan holds the shared slot too: the KV cache gets less than without the directory.
    without = _report(tmp_path, None, **adapters)
    assert without.plan.engine_args["kv_cache_memory_bytes"] > args["kv_cache_memory_bytes"]


def test_lora_settings_the_engine_cannot_use_refuse_the_start(tmp_path):
    no_dir = _report(tmp_path, {"lora_max_rank": 32})
    assert any("lora_max_rank" in e and "set lora_dir too" in e for e in no_dir.errors), no_dir.errors
    with pytest.raises(ValueError, match="lora_dir\n  Path does not point to a directory"):
        Settings(lora_dir=tmp_path / "nowhere")
    too_wide = _report(tmp_path, {"lora_dir": tmp_path, "lora_max_rank": 600})
    assert any("(lora_max_rank, r=600) is wider than vLLM serves" in e for e in too_wide.errors), too_wide.errors


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("sql", "lib/sql"),
        ("team/sql", "lib/team/sql"),
        ("./sql/../chat", "lib/chat"),
        ("{lib}/sql", "lib/sql"),
        ("..", None),
        ("../lib2/sql", None),
        ("sql/../../etc", None),
        ("/etc", None),
        (".", None),
        ("{lib}", None),
    ],
)
def test_an_adapter_loaded_while_serving_comes_from_inside_lora_dir(tmp_path, given, expected):
    from service.server.http.lora_routes import inside

    lib = tmp_path / "lib"
    found = inside(lib, given.format(lib=lib))
    assert found == (tmp_path / expected if expected else None)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("sql", "lib/sql"),
        ("team/sql", "lib/team/sql"),
        ("./sql", None),
        ("sql/", None),
        ("team//sql", None),
        ("team/../sql", None),
        ("../sql", None),
        ("..", None),
        (".", None),
        ("", None),
        ("{lib}/sql", None),
        ("sql\x00", "lib/sql\x00"),  # the name as written; no file is found by it, so the request gets vLLM's 404
    ],
)
def test_a_request_names_an_adapter_of_lora_dir_by_its_relative_path_as_written(tmp_path, name, expected):
    from service.server.http.lora_routes import named_dir

    lib = tmp_path / "lib"
    found = named_dir(lib, name.format(lib=lib))
    assert found == (tmp_path / expected if expected else None)
    assert named_dir(tmp_path / "other" / ".." / "lib", name.format(lib=lib)) == found  # lora_dir as given


def test_an_adapter_loaded_while_serving_must_fit_the_slots_and_the_model(tmp_path):
    from service.facts.model import inspect_model
    from service.policy.engine.lora import adapter_misfit

    model = inspect_model(choose_model(Settings(cache_dir=tmp_path / "c"), build_demo=False).location)
    fits = read_adapter("fits", _smollm2_adapter(tmp_path / "fits", 16))
    assert adapter_misfit(fits, model, 16) is None
    wide = adapter_misfit(read_adapter("wide", _smollm2_adapter(tmp_path / "wide", 32)), model, 16)
    assert (
        wide == "LoRA adapter 'wide' has rank 32; this engine's adapter slots hold rank 16 (set lora_max_rank to "
        "load wider ones)"
    )
    other = adapter_misfit(read_adapter("demo", make_adapter(tmp_path / "demo", 0)), model, 16)
    assert other is not None and "its q_proj takes 256 inputs" in other, other


def test_adapters_the_engine_cannot_serve_refuse_the_start(tmp_path):
    wide = _smollm2_adapter(tmp_path / "wide")
    config = json.loads((wide / "adapter_config.json").read_text())
    (wide / "adapter_config.json").write_text(json.dumps({**config, "r": 1024}))
    report = _report(tmp_path, wide=wide, **{"SmolLM2-135M-Instruct": _smollm2_adapter(tmp_path / "same")})
    assert any("wide (r=1024) is wider than vLLM serves (ranks up to 512)" in e for e in report.errors), report.errors
    assert any("'SmolLM2-135M-Instruct' is the served model's own name" in e for e in report.errors), report.errors
    missing = _report(tmp_path, sql=tmp_path / "nowhere")
    assert any("LoRA adapter 'sql'" in e and "is not a directory" in e for e in missing.errors), missing.errors


def test_the_ranks_are_vllms():
    from vllm.config.lora import MaxLoRARanks

    assert typing.get_args(MaxLoRARanks) == LORA_RANKS


def _stacked(slots: int, rows: int, cols: int, seed: int) -> torch.Tensor:
    return torch.randn(slots, 1, rows, cols, generator=torch.Generator().manual_seed(seed))


def test_the_fixed_ops_keep_vllms_signatures():
    from vllm.lora.ops.torch_ops import lora_ops

    def parameters(function):
        return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]

    for name in lora_rows.FIXED:
        assert parameters(getattr(lora_rows, name)) == parameters(getattr(lora_ops, name)), name


@pytest.mark.parametrize("indices", [[0, -1, 1, -1], [1, 1, 1, 1], [1, -1, -1, -1], [-1, -1, -1, -1]])
def test_base_model_tokens_get_no_adapters_delta_and_the_others_vllms(indices):
    """Tokens with no adapter (-1): vLLM's own ops give them the last slot's delta; the fixed ones none. The others get
    vLLM's values, to float rounding (a matmul per adapter in place of one per token)."""
    from vllm.lora.ops.torch_ops import lora_ops

    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(0))
    indices = torch.tensor(indices)
    a, b = _stacked(2, 8, 32, 1), _stacked(2, 48, 8, 2)
    base = torch.randn(4, 48, generator=torch.Generator().manual_seed(3))

    def run(ops):
        shrunk = torch.zeros(4, 8)
        ops.bgmv_shrink(x, a, shrunk, indices, 0.5)
        out = base.clone()
        ops.bgmv_expand(shrunk, b, out, indices, add_inputs=True)
        sliced = base.clone()
        ops.bgmv_expand_slice(shrunk, b[:, :, :16], sliced, indices, 16, 16, add_inputs=True)
        return shrunk, out, sliced

    theirs, ours = run(lora_ops), run(lora_rows)
    keep, drop = indices >= 0, indices < 0
    for t, o in zip(theirs, ours, strict=True):
        torch.testing.assert_close(o[keep], t[keep], rtol=1e-5, atol=1e-5)
    if drop.any():
        assert torch.count_nonzero(ours[0][drop]) == 0 and torch.count_nonzero(theirs[0][drop]) > 0
        assert torch.equal(ours[1][drop], base[drop]) and not torch.equal(theirs[1][drop], base[drop])
        assert torch.equal(ours[2][drop], base[drop])
    # The prefill op calls the module's bgmv: patched, a -1 sequence gets nothing either.
    expanded = torch.zeros(4, 48)
    lora_rows.bgmv_expand(torch.ones(4, 8), b, expanded, indices, add_inputs=False)
    assert torch.count_nonzero(expanded[drop]) == 0


def test_the_fix_reaches_vllms_module_and_the_cpu_wrapper_once(monkeypatch):
    from vllm.lora.ops import torch_ops
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu

    for module in (lora_ops, torch_ops, punica_cpu):
        for name in lora_rows.FIXED:
            monkeypatch.setattr(module, name, getattr(module, name))
    monkeypatch.delattr(lora_ops, "_cpu_llm_service_no_lora_rows", raising=False)
    assert lora_rows.apply_lora_rows_fix(False) == "not needed"
    assert punica_cpu.bgmv_shrink is not lora_rows.bgmv_shrink
    assert lora_rows.apply_lora_rows_fix(True) == "applied"
    assert lora_rows.apply_lora_rows_fix(True) == "already applied"
    for module in (lora_ops, torch_ops, punica_cpu):
        assert all(getattr(module, name) is getattr(lora_rows, name) for name in lora_rows.FIXED)
    monkeypatch.setattr(lora_ops, "_cpu_llm_service_no_lora_rows", False)


def test_an_adapter_records_the_widths_and_layers_its_header_names(tmp_path):
    facts = read_adapter("wide", make_adapter(tmp_path / "wide", seed=0, layers=3, width=64))
    assert facts.inputs == (("q_proj", 64), ("v_proj", 64)) and facts.layers == 3


@pytest.mark.parametrize(
    ("layers", "width", "message"),
    [
        (4, 2048, "its q_proj takes 2048 inputs; the model's linear layers take 576 or 1536"),
        (40, 576, "it changes 40 layers; the model has 30"),
    ],
)
def test_an_adapter_made_for_another_base_model_refuses_the_start_before_the_engine(tmp_path, layers, width, message):
    """SmolLM2-135M: 30 layers, 576 wide, MLP 1536. vLLM would find the misfit after the engine's start, naming no
    adapter: "The size of tensor a (256) must match the size of tensor b (2048)"."""
    report = _report(tmp_path, other=make_adapter(tmp_path / "other", 0, layers=layers, width=width))
    assert any(e.startswith("lora_adapters: 'other' does not fit the model") and message in e for e in report.errors), (
        report.errors
    )
    fits = _report(tmp_path, same=_smollm2_adapter(tmp_path / "same"))
    assert fits.ok, fits.errors


def test_the_adapters_slots_are_held_beside_the_weights_in_the_memory_budget(tmp_path):
    """vLLM allocates max_loras slots of max_lora_rank at start, and a CPU engine's KV cache is given in bytes: the
    KV budget shrinks by the slots, and a limit that holds the model alone but not its slots refuses the start."""
    from dataclasses import replace

    from service.facts.limits import Limits
    from service.facts.model import inspect_model, packaged_default_model_path
    from service.policy.engine.lora import lora_slot_bytes
    from service.policy.engine.memory import KV_SPARE_TOKENS, GiB, plan_memory

    adapters = {f"a{i}": _smollm2_adapter(tmp_path / f"a{i}", 64) for i in range(3)}
    model = inspect_model(str(packaged_default_model_path()), cache_dir=tmp_path / "cache", lora_adapters=adapters)
    slots = lora_slot_bytes(model, 4)
    one_slot = lora_slot_bytes(replace(model, lora_adapters=model.lora_adapters[:1]), 4)
    assert slots == 3 * one_slot > 0 and lora_slot_bytes(replace(model, lora_adapters=()), 4) == 0
    limits = Limits(frozenset({0}), "test", None, 8 * GiB, 8 * GiB, "test")
    common = {"dtype_bytes": 4, "max_model_len": 2048, "tp_size": 1, "max_num_seqs": 100_000, "kv_cache_gib": None}
    without = plan_memory(limits, model, headroom_gib=1.0, **common)
    held = plan_memory(limits, model, headroom_gib=1.0, lora_bytes=slots, **common)
    assert without.kv_cache_bytes - held.kv_cache_bytes == slots, "the whole budget goes to the cache, less the slots"
    assert "LoRA slots" in held.reason and "LoRA" not in without.reason
    # Headroom such that one max-length request fits beside the weights, and not beside the weights and the slots.
    one_request = model.kv_bytes_per_token(4) * (2048 + KV_SPARE_TOKENS)
    tight = (8 * GiB - model.weight_bytes - one_request - slots // 2) / GiB
    assert plan_memory(limits, model, headroom_gib=tight, **common).error is None
    refused = plan_memory(limits, model, headroom_gib=tight, lora_bytes=slots, **common)
    assert refused.error and "+ LoRA slots" in refused.error, refused


def test_refused_loads_leave_no_state_and_a_names_lock_lives_only_while_used(tmp_path):
    """50 refused loads kept 50 locks (5 MB of names) for ever; now names and paths are checked before any lock,
    and a lock is dropped by its last user."""
    import asyncio
    from types import SimpleNamespace

    from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest

    from service.server.http.lora_routes import AdapterLoader
    from service.server.http.routes import LOAD_LORA, ROUTES
    from service.server.openai_compat.errors import ServiceError

    model = SimpleNamespace(lora_adapters=())  # refused before the model is read
    loader = AdapterLoader(tmp_path / "lib", model, 16)
    models = SimpleNamespace(is_base_model=lambda name: False)
    state = SimpleNamespace(openai_serving_models=models, lora_loader=loader)
    request = SimpleNamespace(app=SimpleNamespace(state=state))
    (load,) = [r.handler for r in ROUTES if r.path == LOAD_LORA]

    async def refused() -> list[str]:
        params = []
        for i in range(50):
            for name, path in ((f"n{i}" + "x" * 100_000, "sql"), (f"n{i}", "../../etc"), (f"n{i}\x00", "sql")):
                with pytest.raises(ServiceError) as refusal:
                    await load(LoadLoRAAdapterRequest(lora_name=name, lora_path=path), request)
                params.append(refusal.value.param)
                assert len(refusal.value.message) < 400
        return params

    params = asyncio.run(refused())
    assert set(params) == {"lora_name", "lora_path"} and loader.locks_kept() == 0

    async def shared() -> int:
        held = asyncio.Event()

        async def first() -> None:
            async with loader.lock("sql"):
                held.set()
                await asyncio.sleep(0.01)

        async def second() -> int:
            await held.wait()
            kept_while_waiting = loader.locks_kept()
            async with loader.lock("sql"):
                pass
            return kept_while_waiting

        _, kept = await asyncio.gather(first(), second())
        return kept

    assert asyncio.run(shared()) == 1 and loader.locks_kept() == 0
