"""The built-in demo: a tiny random-weight Llama chat model, created deterministically on first use.

The smallest engine there is, for the tests that need one: `SERVICE_MODEL=demo-tiny-llama`. Its output is gibberish
by design; it is named and announced as a demo everywhere (log, /v1/models). The default model is a real one.
"""

from __future__ import annotations

from pathlib import Path

from service.cache.atomic_dir import build_once

DEMO_NAME = "demo-tiny-llama"
DEMO_VERSION = "v1"  # bump when the recipe changes, so caches rebuild
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
# A fixed corpus keeps the tokenizer identical from run to run and machine to machine.
_WORDS = (
    "the a an of to in is was for on that with as by at from it this be are or have not but what all were "
    "when we there can your which their said if do will each about how up out them then she many some so "
    "these would other into has more her two like him see time could no make than first been its who now "
    "people my made over did down only way find use may water long little very after words called just "
    "where most know get through back much go good new write our me man too any day same right look think "
    "also around another came come work three word must because does part even place well such here take "
    "why help put different away again off went old number great tell men say small every found still "
    "between name should home big give air line set own under read last never us left end along while "
    "model cpu token server request answer question hello world service engine memory thread core cache"
).split()


def demo_dir(cache_dir: Path) -> Path:
    return cache_dir / "models" / f"{DEMO_NAME}-{DEMO_VERSION}"


def _corpus(lines: int = 4000) -> list[str]:
    n = len(_WORDS)
    return [" ".join(_WORDS[(i * 7 + j * 13 + i * j) % n] for j in range(12)) + "." for i in range(lines)]


def build_tokenizer(directory: Path, vocab_size: int = 2048) -> None:
    """Train a small byte-level BPE tokenizer on the built-in corpus and save it with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="</s>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)


# What every model built on the demo tokenizer shares: its vocabulary and special token ids, bf16 weights.
TOKENIZER_CONFIG = dict(vocab_size=2048, bos_token_id=1, eos_token_id=2, pad_token_id=2, torch_dtype="bfloat16")


def save_random_model(directory: Path, config_class: str, model_class: str, **config: object) -> None:
    """A random-weight transformers model of the demo tokenizer (seed 0, bf16), saved to `directory`."""
    import torch
    import transformers

    torch.manual_seed(0)
    hf_config = getattr(transformers, config_class)(**{**TOKENIZER_CONFIG, **config})
    getattr(transformers, model_class)(hf_config).to(torch.bfloat16).save_pretrained(directory)


def _build_llama(directory: Path) -> None:
    save_random_model(
        directory,
        "LlamaConfig",
        "LlamaForCausalLM",
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )


def build_model(directory: Path, build_weights=_build_llama) -> Path:
    """Create the model at `directory` once (service/cache/atomic_dir.py: concurrent callers race safely)."""

    def fill(staging: Path) -> None:
        build_tokenizer(staging)
        build_weights(staging)

    build_once(directory, fill)
    return directory


def ensure_demo_model(cache_dir: Path) -> Path:
    return build_model(demo_dir(cache_dir))
