"""A model table's hub models: planned from the cache by `detect`, downloaded first by `serve` (plan_table with
download), against the loopback hub."""

from __future__ import annotations

import json
import os

import numpy as np
from safetensors.numpy import save_file

from service.settings import Settings
from service.startup.table_report import plan_table


def test_serve_downloads_a_listed_hub_model_that_detect_only_looks_for(hub, tmp_path, monkeypatch):
    for name in list(os.environ):
        if name.startswith("SERVICE_"):
            monkeypatch.delenv(name)
    repo = hub.root / "acme/demo"
    repo.mkdir(parents=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "vocab_size": 256}
    config |= {"num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 128}
    (repo / "config.json").write_text(json.dumps(config | {"max_position_embeddings": 512}))
    (repo / "tokenizer_config.json").write_text("{}")
    save_file({"model.embed_tokens.weight": np.zeros((256, 64), dtype=np.float32)}, str(repo / "model.safetensors"))
    settings = Settings(models=[{"source": "acme/demo", "name": "demo"}], cache_dir=tmp_path / "cache")
    looked = plan_table(settings)
    assert not looked.ok and "not in the Hugging Face cache" in looked.errors[0]
    assert hub.fetched(".safetensors") == []
    lines = []
    fetched = plan_table(settings, download=True, progress=lines.append)
    assert fetched.ok, fetched.errors
    assert [p for p in hub.fetched(".safetensors") if "/acme/demo/" in p]
    assert plan_table(settings).ok  # in the cache now: detect plans it too
