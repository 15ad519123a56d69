"""bench/parts/speculative.py: which server each variant is, and what its ratios compare."""

from __future__ import annotations

from bench.parts.speculative import (
    DRAFT,
    HEADLINE,
    PEER_VARIANTS,
    RATIOS,
    SUFFIX_HEADLINE,
    SUFFIX_PEER_VARIANTS,
    SUFFIX_VARIANTS,
    VARIANTS,
    our_variants,
    served_names,
)


def test_each_variant_of_ours_is_asked_for_our_model_and_each_peer_for_its_own():
    ours = [*VARIANTS, *SUFFIX_VARIANTS]
    names = served_names(ours, [*ours, *PEER_VARIANTS, *SUFFIX_PEER_VARIANTS], "peer")
    assert {v for v, n in names.items() if n == "bench"} == set(ours)
    assert {v for v, n in names.items() if n == "peer"} == {*PEER_VARIANTS, *SUFFIX_PEER_VARIANTS}


def test_every_ratio_compares_variants_that_run_and_the_headlines_are_ratios():
    known = {*our_variants(True, "eagle:/heads/h"), *PEER_VARIANTS, *SUFFIX_PEER_VARIANTS}
    assert all(a in known and b in known and a != b for a, b in RATIOS)
    assert {HEADLINE, SUFFIX_HEADLINE} <= {f"{a}/{b}" for a, b in RATIOS}


def test_a_draft_setting_is_a_server_of_ours_drafting_with_it():
    assert DRAFT not in our_variants(True, None)
    assert our_variants(False, "eagle:/heads/h")[DRAFT] == {"SERVICE_SPECULATIVE": "eagle:/heads/h"}


def test_llama_cpp_starts_with_the_environment_the_peer_table_ran_it_with(tmp_path, monkeypatch):
    """Where llama.cpp's repacking crashed in the peer table, its speculation servers start with it off too: they
    died of the same SIGILL on an AMX guest, and the speculation was left out."""
    from types import SimpleNamespace

    import bench.servers
    from bench.context import REPACK_OFF
    from bench.parts import peer, speculative

    class Started:
        url = "http://127.0.0.1:1"

        def __init__(self, env, *args, **kwargs):
            self.env = env

        def start(self):
            return self

        def wait_ready(self, timeout):
            pass

        def close(self):
            pass

    llama_envs = []

    def llama_server(gguf, cpus, slots, log_path, env=None, **kwargs):
        llama_envs.append(env)
        return Started(env)

    monkeypatch.setattr(speculative, "ServerProcess", Started)
    monkeypatch.setattr(bench.servers, "llama_server", llama_server)
    monkeypatch.setattr(bench.servers.Reported, "fetch", staticmethod(lambda url: SimpleNamespace(engine_cpus=[0])))
    started = speculative.start_all({}, tmp_path / "m.gguf", 1, tmp_path, 0, True, REPACK_OFF)
    assert set(started) == {*VARIANTS, *SUFFIX_VARIANTS, *PEER_VARIANTS, *SUFFIX_PEER_VARIANTS}
    assert llama_envs == [REPACK_OFF] * len({*PEER_VARIANTS, *SUFFIX_PEER_VARIANTS})

    handed = []
    monkeypatch.setattr(speculative, "measure", lambda *args: handed.append(args[-1]) or {})
    options = peer.PeerOptions(file=str(tmp_path / "m.gguf"))
    peer.speculation(SimpleNamespace(logdir=tmp_path), options, tmp_path, REPACK_OFF)
    assert handed == [REPACK_OFF]
