"""Speculative decoding: whether the engine drafts tokens and verifies them in one step, and how.

Batch-1 decode on a CPU is bound by reading the weights, so verifying k drafted tokens costs about one step and every
accepted token is nearly free; a rejected draft costs the drafting and the wider step. vLLM 0.32's CPU build runs the
n-gram proposer (drafts from the request's own tokens: a document quoted back, code edited in place, a tool result
summarised), suffix decoding (arctic-inference's trees over prompts and past answers), a draft model, and an EAGLE
head (one layer that drafts from the target's last hidden state; `eagle:<dir>`, trained for the target). `auto`
turns on what measured faster on this CPU class on free generation as well as on repeated text; a method that loses
on free text stays off by default, for the user to turn on where their traffic repeats itself.

A draft model or an EAGLE head must be a local directory of config.json and safetensors weights (read by
service/facts/draft_model.py): vLLM would download a hub id itself, past the pre-flight, the disk check and the
refusal of pickled weights the served model gets. vLLM builds the draft's config with the served model's
trust_remote_code: code shipped with the draft would run on a consent given for the served model, so a draft
whose config names code (auto_map) is refused while trust_remote_code is on (off, transformers does not run it).
"""

from __future__ import annotations

from service.facts.draft_model import DraftFacts
from service.in_vllm.contract import SAMPLER_ENV
from service.measurements.store import cite, store
from service.policy.plan.decision import PolicyResult, Source, engine, env

# The n-gram proposer as measured: up to 4 drafted tokens, matched on the last 2 to 4 tokens of the request.
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
SUFFIX = {"method": "suffix"}
DRAFT_TOKENS = 4  # a draft model's tokens per step
EAGLE = "eagle:"  # the setting's prefix of an EAGLE head's directory
METHODS = ("auto", "off", "ngram", "suffix")  # the values that name no directory
EAGLE_TOKENS = 3  # an EAGLE head's tokens per step, as claim/eagle-head/amx measured them
# Where the engine drafts, vLLM 0.32's CPU fallback of the rejection sampler's expand kernel leaves the per-token
# temperatures unwritten; "torch" has the service's plugin put its own in its place (service/in_vllm/rejection_sampler.py).
SAMPLER_WHY = (
    "vLLM 0.32's CPU fallback of the rejection sampler's expand kernel writes into an int64 copy, so a sampled "
    "request's per-token temperatures were left unwritten and its drafted steps sampled from garbage "
    f"({cite('claim/cpu-rejection-sampler/zen4')}); the service's torch expand computes what the Triton kernel does"
)


def measured_key(backend: str) -> str:
    return f"claim/ngram-speculation/{backend}"


def draft_directory(setting: str) -> str | None:
    """The directory a speculative value names (a draft model's, an EAGLE head's), else None."""
    return None if setting in METHODS else setting.removeprefix(EAGLE) or None


def plan_speculative(
    setting: str,
    user: bool,
    backend: str,
    arctic_inference: str | None,
    vllm: str | None = None,
    draft: DraftFacts | None = None,
    trust_remote_code: bool = False,
) -> PolicyResult:
    """`setting`: the speculative setting; `user`: the user set it; `backend`: the CPU class whose measurement
    decides `auto`; `arctic_inference`: its installed version, which suffix decoding needs; `vllm`: its version;
    `draft`: the directory draft_directory(setting) names, as read (None: not read); `trust_remote_code`: the
    setting, which vLLM hands the draft too."""
    decided = _method(setting, user, backend, arctic_inference, draft, trust_remote_code)
    if decided.engine_args.get("speculative_config") is None or not (vllm or "").startswith("0.32."):
        return decided
    return decided + PolicyResult.of(env(SAMPLER_ENV, "torch", SAMPLER_WHY, "policy"))


def _method(
    setting: str,
    user: bool,
    backend: str,
    arctic_inference: str | None,
    draft: DraftFacts | None,
    trust_remote_code: bool,
) -> PolicyResult:
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
    if setting != "auto":
        return _directory(setting, draft, trust_remote_code, source)
    key = measured_key(backend)
    if key not in store().rows:
        why = f"off: speculative decoding is not measured on the {backend} backend's CPUs; speculative=ngram turns on "
        return PolicyResult.of(engine("speculative_config", None, why + "n-gram drafting", "policy"))
    # On by default only where free generation did not lose: the whole interval of its ratio at or above 1.
    on = float(store().rows[key].params["free_generation"][0]) >= 1.0
    verdict = "on (n-gram drafting)" if on else "off"
    why = f"{verdict}: {cite(key)}" + ("" if on else "; speculative=ngram turns it on where the text repeats")
    return PolicyResult.of(engine("speculative_config", NGRAM if on else None, why, "policy"))


def _draft_problems(setting: str, draft: DraftFacts | None, trust_remote_code: bool) -> list[str]:
    """Why the directory the setting names cannot be handed to vLLM (see the module's docstring)."""
    if setting == EAGLE:
        return ["speculative=eagle: names no directory: eagle:<an EAGLE head's directory>"]
    what = f"speculative={setting}: {'an EAGLE head' if setting.startswith(EAGLE) else 'a draft model'}"
    if draft is None or not draft.is_dir:
        where = draft.path if draft else draft_directory(setting)
        return [
            f"{what} must be a local directory holding config.json and safetensors weights, and {where} is not a "
            "directory (vLLM would fetch a hub id itself, unchecked): `python -m service pull org/name` fetches one "
            "from the hub with the start's checks and prints its directory"
        ]
    problems = [f"{what}: {draft.path} has no config.json"] if not draft.has_config else []
    if not draft.safetensors:
        pickled = f" ({', '.join(draft.pickled)}: pickled weights are never loaded)" if draft.pickled else ""
        problems.append(f"{what}: {draft.path} holds no safetensors weights{pickled}")
    problems += [f"{what}: {problem}" for problem in draft.problems]
    if draft.remote_code and trust_remote_code:
        problems.append(
            f"{what}: its config.json names model code ({', '.join(draft.remote_code)}), which vLLM would run "
            "because trust_remote_code is on for the served model: that consent is not the draft's; use a draft "
            "without auto_map, or turn trust_remote_code off (transformers then runs none of the draft's code)"
        )
    return problems


def _directory(setting: str, draft: DraftFacts | None, trust_remote_code: bool, source: Source) -> PolicyResult:
    """A draft model's or an EAGLE head's directory, handed to vLLM as an absolute path where nothing refuses it."""
    problems = _draft_problems(setting, draft, trust_remote_code)
    if problems or draft is None:
        return PolicyResult(errors=tuple(problems))
    if setting.startswith(EAGLE):  # trained for the served model: vLLM shares its embeddings and LM head
        config = {"method": "eagle", "model": draft.path, "num_speculative_tokens": EAGLE_TOKENS}
        why = f"an EAGLE head ({draft.path}) drafts {EAGLE_TOKENS} tokens a step from the model's last hidden state"
    else:
        config = {"method": "draft_model", "model": draft.path, "num_speculative_tokens": DRAFT_TOKENS}
        why = f"a draft model ({draft.path}) proposes {DRAFT_TOKENS} tokens a step"
    return PolicyResult.of(engine("speculative_config", config, why + ", set by the user", source))
