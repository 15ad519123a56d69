"""Speculative decoding: whether the engine drafts tokens and verifies them in one step, and how.

Batch-1 decode on a CPU is bound by reading the weights, so verifying k drafted tokens costs about one step and every
accepted token is nearly free; a rejected draft costs the drafting and the wider step. vLLM 0.32's CPU build runs the
n-gram proposer (drafts from the request's own tokens: a document quoted back, code edited in place, a tool result
summarised), suffix decoding (arctic-inference's trees over prompts and past answers), a draft model, and an EAGLE
head (one layer that drafts from the target's last hidden state; `eagle:<dir>`, trained for the target). `auto`
turns on what measured faster on this CPU class on free generation as well as on repeated text; a method that loses
on free text stays off by default, for the user to turn on where their traffic repeats itself.
"""

from __future__ import annotations

from service.measurements.store import cite, store
from service.policy.decision import PolicyResult, Source, engine, env

# The n-gram proposer as measured: up to 4 drafted tokens, matched on the last 2 to 4 tokens of the request.
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
SUFFIX = {"method": "suffix"}
DRAFT_TOKENS = 4  # a draft model's tokens per step
EAGLE = "eagle:"  # the setting's prefix of an EAGLE head's directory
EAGLE_TOKENS = 3  # an EAGLE head's tokens per step, as claim/eagle-head/amx measured them
# Where the engine drafts, vLLM 0.32's CPU fallback of the rejection sampler's expand kernel leaves the per-token
# temperatures unwritten; "torch" has the service's plugin put its own in its place (service/in_vllm/rejection_sampler.py).
SAMPLER_ENV = "SERVICE_REJECTION_SAMPLER"
SAMPLER_WHY = (
    "vLLM 0.32's CPU fallback of the rejection sampler's expand kernel writes into an int64 copy, so a sampled "
    "request's per-token temperatures were left unwritten and its drafted steps sampled from garbage "
    f"({cite('claim/cpu-rejection-sampler/zen4')}); the service's torch expand computes what the Triton kernel does"
)


def measured_key(backend: str) -> str:
    return f"claim/ngram-speculation/{backend}"


def plan_speculative(
    setting: str, user: bool, backend: str, arctic_inference: str | None, vllm: str | None = None
) -> PolicyResult:
    """`setting`: the speculative setting; `user`: the user set it; `backend`: the CPU class whose measurement
    decides `auto`; `arctic_inference`: its installed version, which suffix decoding needs; `vllm`: its version."""
    decided = _method(setting, user, backend, arctic_inference)
    if decided.engine_args.get("speculative_config") is None or not (vllm or "").startswith("0.32."):
        return decided
    return decided + PolicyResult.of(env(SAMPLER_ENV, "torch", SAMPLER_WHY, "policy"))


def _method(setting: str, user: bool, backend: str, arctic_inference: str | None) -> PolicyResult:
    source: Source = "user" if user else "default"
    if setting == "off":
        return PolicyResult.of(engine("speculative_config", None, "off: set by the user", source))
    if setting == "ngram":
        why = "n-gram drafting from the request's own tokens, set by the user (pays where the text repeats)"
        return PolicyResult.of(engine("speculative_config", NGRAM, why, source))
    if setting == "suffix":
        if arctic_inference is None:
            error = (
                "speculative=suffix: vLLM's suffix decoding needs arctic-inference, which is not installed (it "
                "publishes only its source: `make setup` and the images build it); speculative=ngram drafts from "
                "the request's own tokens"
            )
            return PolicyResult(errors=(error,))
        why = (
            f"suffix decoding (arctic-inference {arctic_inference}), set by the user: drafts from the prompt and from "
            "past answers, so it pays where requests repeat earlier ones"
        )
        return PolicyResult.of(engine("speculative_config", SUFFIX, why, source))
    if setting.startswith(EAGLE):
        return _eagle(setting.removeprefix(EAGLE), source)
    if setting != "auto":
        return _draft_model(setting, source)
    key = measured_key(backend)
    if key not in store().rows:
        why = f"off: speculative decoding is not measured on the {backend} backend's CPUs; speculative=ngram turns on "
        return PolicyResult.of(engine("speculative_config", None, why + "n-gram drafting", "policy"))
    # On by default only where free generation did not lose: the whole interval of its ratio at or above 1.
    on = float(store().rows[key].params["free_generation"][0]) >= 1.0
    verdict = "on (n-gram drafting)" if on else "off"
    why = f"{verdict}: {cite(key)}" + ("" if on else "; speculative=ngram turns it on where the text repeats")
    return PolicyResult.of(engine("speculative_config", NGRAM if on else None, why, "policy"))


def _draft_model(path: str, source: Source) -> PolicyResult:
    """A draft model's directory, as the user named it (vLLM refuses the start where it cannot load it)."""
    config = {"method": "draft_model", "model": path, "num_speculative_tokens": DRAFT_TOKENS}
    why = f"a draft model ({path}) proposes {DRAFT_TOKENS} tokens a step, set by the user"
    return PolicyResult.of(engine("speculative_config", config, why, source))


def _eagle(path: str, source: Source) -> PolicyResult:
    """An EAGLE head's directory, trained for the served model (vLLM shares the target's embeddings and LM head)."""
    if not path:
        return PolicyResult(errors=("speculative=eagle: names no directory: eagle:<an EAGLE head's directory>",))
    config = {"method": "eagle", "model": path, "num_speculative_tokens": EAGLE_TOKENS}
    why = f"an EAGLE head ({path}) drafts {EAGLE_TOKENS} tokens a step from the model's last hidden state, set by the user"
    return PolicyResult.of(engine("speculative_config", config, why, source))
