"""Reference check of the service's kernels: greedy logprobs from the service vs Hugging Face transformers' fp32
forward on the same tokens (teacher-forced), with a comparison that a broken kernel fails."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class Served:
    """What the service answered for one prompt given as token ids."""

    prompt: tuple[int, ...]
    prompt_logprobs: tuple[float, ...]  # of prompt[1:], each given the tokens before it (the prefill path)
    tokens: tuple[int, ...]  # greedy continuation
    logprobs: tuple[float, ...]  # of each continuation token (the decode path)


@dataclass(frozen=True)
class Reference:
    """transformers' fp32 forward over one full sequence."""

    logprobs: torch.Tensor  # [T, vocab] log-softmax; row j scores token j+1
    router_margins: torch.Tensor  # [T] smallest gap between the last chosen and first unchosen expert; inf: no MoE


@dataclass(frozen=True)
class Comparison:
    positions: int  # logprobs compared (prompt and continuation), router near-ties left out
    router_ties: int  # positions left out: an MoE router's expert choice within the router margin in fp32
    greedy: int  # continuation tokens
    top1_equal: int  # continuation tokens that are also the reference's top-1
    near_ties: int  # continuation tokens that differ from the reference's top-1 within the tie margin
    max_abs_diff: float  # max |service logprob - reference logprob| over the compared positions
    mean_abs_diff: float
    # per token that differs from the reference's top-1 by more than the tie margin: the reference's margin of its
    # top-1 over the pick, and |served - reference| on the pick
    mismatch_margins: tuple[tuple[float, float], ...] = ()

    @property
    def top1_mismatches(self) -> int:
        return len(self.mismatch_margins)

    def passes(self, max_tolerance: float, mean_tolerance: float) -> bool:
        return self.top1_mismatches == 0 and self.max_abs_diff <= max_tolerance and self.mean_abs_diff <= mean_tolerance


def prompt_ids(model_dir: Path, texts: list[str]) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [tokenizer(text).input_ids for text in texts]


def query(client, model: str, prompt: list[int], max_tokens: int) -> Served:
    """Greedy completion through /v1/completions with the chosen tokens' logprobs, as token ids."""
    response = client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        logprobs=1,
        extra_body={"return_tokens_as_token_ids": True, "ignore_eos": True, "prompt_logprobs": 0},
    )
    choice = response.choices[0]
    tokens = tuple(int(t.removeprefix("token_id:")) for t in choice.logprobs.tokens)
    per_prompt_token = choice.model_extra["prompt_logprobs"][1:]  # the first token has no context
    return Served(
        prompt=tuple(prompt),
        prompt_logprobs=tuple(entry[str(t)]["logprob"] for entry, t in zip(per_prompt_token, prompt[1:])),
        tokens=tokens,
        logprobs=tuple(choice.logprobs.token_logprobs),
    )


def reference_logprobs(
    model_dir: Path,
    sequences: list[tuple[int, ...]],
    corrupt: Callable[[torch.nn.Module], None] | None = None,
    state: Mapping[str, torch.Tensor] | None = None,
) -> list[Reference]:
    """transformers' fp32 forward over each full sequence, with the MoE routers' top-k margins per position.
    `state`: weights to load over the directory's (a quantized copy's dequantized values)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if state is not None:
        model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    margins: list[torch.Tensor] = []

    def record(router: torch.nn.Module, _inputs, output) -> None:
        # transformers' MoE routers (Qwen3NextTopKRouter ...) return (router_logits, scores, indices).
        top = torch.sort(output[0], dim=-1, descending=True).values
        margins.append(top[:, router.top_k - 1] - top[:, router.top_k])

    for module in model.modules():
        if hasattr(module, "top_k") and hasattr(module, "num_experts"):
            module.register_forward_hook(record)
    references = []
    with torch.no_grad():
        if corrupt is not None:
            corrupt(model)
        for seq in sequences:
            margins.clear()
            logits = model(torch.tensor([seq])).logits[0]
            router = torch.stack(margins).min(dim=0).values if margins else torch.full((len(seq),), torch.inf)
            references.append(Reference(torch.log_softmax(logits.double(), dim=-1), router))
    return references


def compare(served: list[Served], reference: list[Reference], tie_margin: float, router_margin: float) -> Comparison:
    """Greedy tokens against the reference's top-1 (near-ties allowed) and logprobs position by position.

    Where an MoE router's fp32 choice between its last chosen and first unchosen expert is closer than
    `router_margin`, bf16 may pick the other expert: a legitimate jump, left out of the logprob statistics."""
    diffs: list[float] = []
    router_ties = greedy = top1 = ties = 0
    mismatches: list[tuple[float, float]] = []
    for s, ref in zip(served, reference):
        n = len(s.prompt)
        rows = [(j, token, lp) for j, (token, lp) in enumerate(zip(s.prompt[1:], s.prompt_logprobs))]
        rows += [(n - 1 + i, token, lp) for i, (token, lp) in enumerate(zip(s.tokens, s.logprobs))]
        for row, token, lp in rows:
            router_tie = bool(ref.router_margins[row] < router_margin)
            if router_tie:
                router_ties += 1
            else:
                diffs.append(abs(lp - ref.logprobs[row, token].item()))
            if row < n - 1:
                continue
            greedy += 1
            scores = ref.logprobs[row]
            best = int(scores.argmax())
            if best == token:
                top1 += 1
            elif router_tie or scores[best].item() - scores[token].item() < tie_margin:
                ties += 1
            else:
                margin = scores[best].item() - scores[token].item()
                mismatches.append((round(margin, 3), round(abs(lp - scores[token].item()), 3)))
    return Comparison(
        len(diffs),
        router_ties,
        greedy,
        top1,
        ties,
        max(diffs),
        sum(diffs) / len(diffs),
        tuple(mismatches),
    )


def scale_weight(path: str, factor: float) -> Callable[[torch.nn.Module], None]:
    """A corruption: one weight multiplied by `factor` (a kernel that mis-scales one layer)."""
    return lambda model: model.get_parameter(path).mul_(factor)


def swap_rows(path: str, a: int = 0, b: int = 1) -> Callable[[torch.nn.Module], None]:
    """A corruption: two output rows of one weight exchanged (a kernel that mis-indexes one layer)."""

    def corrupt(model: torch.nn.Module) -> None:
        weight = model.get_parameter(path)
        weight[[a, b]] = weight[[b, a]]

    return corrupt
