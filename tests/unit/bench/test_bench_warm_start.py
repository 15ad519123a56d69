"""bench.parts.warm_start reads what each start did from vLLM 0.32's own log lines."""

from bench.parts.warm_start import read_log

COLD = """(Worker pid=1) INFO [decorators.py:743] [backbone] saved AOT compiled function to /c/vllm/x/rank_0_0/model
(EngineCore pid=2) INFO [core.py:402] init engine (profile, create kv cache, warmup model) took 220.58 s"""
UNPATCHED = """(Worker pid=1) WARNING [decorators.py:333] [backbone] Compiling model again due to a load failure from /c/m, \
reason: 'function' object has no attribute 'finalize_loading'
(Worker pid=1) INFO [decorators.py:743] [backbone] saved AOT compiled function to /c/m"""
WARM = """│ patch.vllm_aot_compile_cache │ true │ policy │ every start logged 'Compiling model again due to a load failure' │
(Worker pid=1) INFO [decorators.py:319] [backbone] Directly load AOT compilation from path /c/m
(EngineCore pid=2) INFO [core.py:402] init engine (profile, create kv cache, warmup model) took 31.58 s"""


def test_read_log_tells_compile_recompile_and_load_apart():
    """WARM also holds the service's report quoting the recompile message: only vLLM's own lines count."""
    assert read_log(COLD) == {
        "compiled_and_saved": True,
        "loaded_compiled": False,
        "load_failed_recompiled": False,
        "engine_init_s": 220.58,
        "engine_core_killed": False,
    }
    assert read_log(UNPATCHED)["load_failed_recompiled"] and read_log(UNPATCHED)["engine_init_s"] is None
    assert read_log(WARM) == {
        "compiled_and_saved": False,
        "loaded_compiled": True,
        "load_failed_recompiled": False,
        "engine_init_s": 31.58,
        "engine_core_killed": False,
    }


def test_read_log_tells_an_engine_core_vllm_had_to_kill():
    stopped = """(MainProcess pid=3) WARNING 11-28 04:10:44 [utils.py:653] [shutdown] Process manager: force killing \
remaining process EngineCore pid 20832"""
    assert read_log(stopped)["engine_core_killed"]
