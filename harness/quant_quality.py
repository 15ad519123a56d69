"""Is a quantized model's output its bf16 source's output? Greedy decode from the quantized model (any engine),
scored token by token against the bf16 source run teacher-forced in transformers:

- top-1 agreement: the share of generated tokens that are also the source's argmax at that position;
- logprob agreement: the mean |logprob(quantized) - logprob(source)| of the generated tokens.

A correct kernel differs from bf16 by rounding noise; a broken one (wrong scale, wrong packing, wrong layout) by
far more. THRESHOLDS separate the two; they were set from measurements (docs/quantization.md) of correct kernels
and of copies with a corrupted scale, on the random-weight models of harness/quantized_models.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

QUALITY_TOKENS = 24  # greedy tokens scored per prompt
PROMPTS = (
    "the model answers a question about the cache",
    "hello world, the server thread",
    "what time is it now in the engine",
    "write the number of words in this line",
)


@dataclass(frozen=True)
class Threshold:
    min_top1: float
    max_mean_abs_dlogprob: float


# Per scheme of harness/quantized_models.py. Measured on the demo model with the exact dequantized weights
# (an ideal kernel) against copies whose o_proj scales were multiplied (a broken one), 4 prompts x 24 tokens:
#   w8a8  exact: top1 0.99, |dlogprob| 0.004;  scale x1.25: 0.98, 0.078;  x2: 0.94, 0.21;  x4: 0.93, 0.35
#   w4a16 exact: top1 0.97, |dlogprob| 0.035;  scale x2: 0.93, 0.23;  x4: 0.94, 0.34
# Greedy tokens of a random model agree often even when broken, so the logprob gap is what separates them; the
# margins above leave room for an engine's own bf16 rounding and (W8A8) its activation quantization.
THRESHOLDS = {
    "bf16": Threshold(0.9, 0.05),
    "fp32": Threshold(0.9, 0.05),  # an fp32 engine on the same bf16 values: at least as close as the bf16 one
    "w8a8": Threshold(0.85, 0.12),
    "w8a8-static": Threshold(0.85, 0.12),
    "w4a16": Threshold(0.85, 0.15),
}


@dataclass(frozen=True)
class Quality:
    tokens: int
    top1: float
    mean_abs_dlogprob: float

    def passes(self, scheme: str) -> bool:
        t = THRESHOLDS[scheme]
        return self.top1 >= t.min_top1 and self.mean_abs_dlogprob <= t.max_mean_abs_dlogprob

    def logprob_passes(self, scheme: str) -> bool:
        """The logprob criterion alone: for a model whose logits are near-flat (the 0.5 B random bench model), where
        a kernel's own rounding (W8A8's per-token activation quantization) flips greedy near-ties without being
        wrong; measured there: correct W8A8 kernel 0.052, corrupted scale 1.43 (docs/quantization.md)."""
        return self.mean_abs_dlogprob <= THRESHOLDS[scheme].max_mean_abs_dlogprob

    def as_dict(self) -> dict:
        return {
            "tokens": self.tokens,
            "top1": round(self.top1, 4),
            "mean_abs_dlogprob": round(self.mean_abs_dlogprob, 4),
        }


def prompt_ids(source: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(source)
    return [tok(p)["input_ids"] for p in PROMPTS]


def score(
    source: Path,
    prompts: Sequence[Sequence[int]],
    generated: Sequence[Sequence[int]],
    logprobs: Sequence[Sequence[float]],
    state_dict: dict | None = None,
) -> Quality:
    """Score greedy continuations (`generated[i]` after `prompts[i]`, with the quantized model's `logprobs[i]` of
    those tokens) against the model at `source` in bf16 (or with `state_dict`'s weights laid over it)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16)
    if state_dict is not None:
        model.load_state_dict(state_dict, strict=False)
    agree = total = 0
    dlogprob = 0.0
    with _one_thread(), torch.no_grad():
        for prompt, gen, lps in zip(prompts, generated, logprobs):
            ids = torch.tensor([list(prompt) + list(gen)])
            logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
            ref = torch.log_softmax(logits, dim=-1)
            gen_t = torch.tensor(list(gen))
            agree += int((ref.argmax(-1) == gen_t).sum())
            dlogprob += float((ref.gather(1, gen_t[:, None])[:, 0] - torch.tensor(list(lps))).abs().sum())
            total += len(gen)
    return Quality(total, agree / total, dlogprob / total)


def greedy_with(model_dir: Path, state_dict: dict, prompts: Sequence[Sequence[int]], tokens: int):
    """Greedy continuations and their logprobs from transformers with `state_dict`'s weights: what an ideal kernel
    for a quantized checkpoint computes (harness/quantized_models.dequantized_state)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    model.load_state_dict(state_dict, strict=False)
    gens, lps = [], []
    with _one_thread(), torch.no_grad():
        for prompt in prompts:
            out = model.generate(
                torch.tensor([list(prompt)]),
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
                pad_token_id=model.config.eos_token_id,
            )
            gen = out.sequences[0, len(prompt) :].tolist()
            step_lps = [torch.log_softmax(step[0].float(), -1)[t] for step, t in zip(out.logits, gen)]
            gens.append(gen)
            lps.append([float(x) for x in step_lps])
    return gens, lps


@contextmanager
def _one_thread():
    """One torch thread: these models are tiny, and OpenMP spinning on a shared, loaded machine costs far more."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
