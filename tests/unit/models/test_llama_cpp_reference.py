"""llama.cpp's reference kept in a converted copy (service/models/llama_cpp_reference.py): taken once, and taken
again where it was unavailable."""

from __future__ import annotations

import json

from service.models.llama_cpp_reference import REFERENCE, ensure_reference


def test_a_kept_reference_is_read_not_taken_again(tmp_path):
    kept = {"text": "t", "tokens": [1, 2], "logprobs": [-1.0], "top": [2]}
    (tmp_path / REFERENCE).write_text(json.dumps(kept))
    assert ensure_reference(tmp_path / "absent.gguf", tmp_path) == kept


def test_an_unavailable_reference_is_taken_again_and_says_why(tmp_path):
    (tmp_path / REFERENCE).write_text(json.dumps({"unavailable": "an earlier start had no llama.cpp"}))
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"not a GGUF file")
    result = ensure_reference(not_gguf, tmp_path)
    # Whatever this checkout has (llama.cpp built or not), this start tried again and said why it could not score.
    assert result["unavailable"] != "an earlier start had no llama.cpp"
    assert json.loads((tmp_path / REFERENCE).read_text()) == result
