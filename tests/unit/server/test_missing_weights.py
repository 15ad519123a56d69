"""A local model directory without the files vLLM's loader looks for is refused before any engine process starts."""

from __future__ import annotations

import pytest

from service.server.supervision.engine_start import missing_weights


@pytest.mark.parametrize("name", ["model.safetensors", "model-00001-of-00002.safetensors", "pytorch_model.bin", "w.pt"])
def test_a_directory_with_a_weights_file_passes(tmp_path, name):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / name).write_bytes(b"")
    assert missing_weights(str(tmp_path), "auto") is None


def test_a_directory_of_config_and_tokenizer_alone_is_named(tmp_path):
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_text("{}")
    (tmp_path / "original").mkdir()
    (tmp_path / "original" / "consolidated.00.pth").write_bytes(b"")  # vLLM does not look in subdirectories
    assert missing_weights(str(tmp_path), "auto") == (
        f"{tmp_path} holds no weights: vLLM looks there for *.safetensors, *.bin, *.pt files and finds none "
        "(a copy or download of the config and tokenizer alone?)"
    )


def test_another_load_format_or_a_hub_id_is_left_to_vllm(tmp_path):
    assert missing_weights(str(tmp_path), "dummy") is None
    assert missing_weights("HuggingFaceTB/SmolLM2-135M-Instruct", "auto") is None
