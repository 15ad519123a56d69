"""Hub ids fetched as `vllm serve` and llama.cpp's `-hf` fetch them, and Ollama's store read in place: huggingface_hub
run unchanged against a loopback server that answers the hub's routes (this machine cannot reach the hub)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from safetensors.numpy import save_file

from service.models.hub_download import DownloadRefused, HubSpec, fetch, parse_hub_id, pick_gguf
from service.models.ollama_store import OllamaModelNotFound, find_ollama_model, manifest_path
from tests.support.ollama_store import ollama_store

REPO = Path(__file__).resolve().parents[3]


def checkpoint(root: Path, repo: str, weights: int = 40_000) -> Path:
    import numpy as np

    d = root / repo
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    (d / "tokenizer_config.json").write_text("{}")
    save_file({"w": np.arange(weights // 4, dtype=np.float32)}, str(d / "model.safetensors"))
    (d / "pytorch_model.bin").write_bytes(b"pickle" * 10_000)  # never loaded, never fetched
    (d / "original").mkdir()
    (d / "original" / "consolidated.00.pth").write_bytes(b"pth" * 10_000)
    return d


def no_problem(directory: Path, weight_bytes: int) -> list[str]:
    return []


def test_hub_ids_parse_with_revision_and_tag():
    assert parse_hub_id("Qwen/Qwen3-0.6B") == HubSpec("Qwen/Qwen3-0.6B")
    assert parse_hub_id("Qwen/Qwen3-0.6B@v1.0") == HubSpec("Qwen/Qwen3-0.6B", "v1.0")
    assert parse_hub_id("Qwen/Qwen3-0.6B-GGUF:Q8_0") == HubSpec("Qwen/Qwen3-0.6B-GGUF", None, "Q8_0")
    assert parse_hub_id("/models/x.gguf") is None and parse_hub_id("ollama:qwen3:0.6b") is None


def test_a_tag_picks_its_file_as_llama_cpp_does():
    files = ["README.md", "m-Q8_0.gguf", "m-Q4_K_M.gguf", "m-BF16.gguf", "mmproj-m-Q4_K_M.gguf"]
    assert pick_gguf(files, "q8_0")[0] == "m-Q8_0.gguf"  # case-insensitive
    name, why = pick_gguf(files, None)
    assert name == "m-Q4_K_M.gguf" and "Q4_K_M" in why  # llama.cpp's default, the projector is not a model
    assert pick_gguf(["a-Q5_K_S.gguf", "a-Q8_0.gguf"], None)[0] == "a-Q8_0.gguf"  # then Q8_0
    assert pick_gguf(["b-Q5_K_S.gguf", "a-Q6_K.gguf"], None)[0] == "b-Q5_K_S.gguf"  # then the first model file
    with pytest.raises(DownloadRefused, match=r"no GGUF file tagged 'Q2_K'.*BF16, Q4_K_M, Q8_0"):
        pick_gguf(files, "Q2_K")
    assert pick_gguf(["m-Q8_0-00002-of-00002.gguf", "m-Q8_0-00001-of-00002.gguf"], "Q8_0")[0].endswith(
        "1-of-00002.gguf"
    )


def test_a_checkpoint_comes_with_only_the_files_serving_needs(hub, tmp_path):
    checkpoint(hub.root, "acme/tiny")
    seen: list[tuple[list[str], int]] = []

    def preflight(directory: Path, weight_bytes: int) -> list[str]:
        seen.append((sorted(p.name for p in directory.iterdir()), weight_bytes))
        return []

    got = fetch(parse_hub_id("acme/tiny"), tmp_path / "cache", preflight)
    assert sorted(p.name for p in got.path.iterdir()) == ["config.json", "model.safetensors", "tokenizer_config.json"]
    weights = (hub.root / "acme/tiny/model.safetensors").stat().st_size
    assert seen == [(["config.json", "tokenizer_config.json"], weights)]  # the pre-flight ran before the weights came
    assert hub.fetched(".bin") == [] and hub.fetched(".pth") == []
    again = fetch(parse_hub_id("acme/tiny"), tmp_path / "cache", no_problem)
    assert again.path == got.path and "in the cache" in again.why and len(hub.fetched(".safetensors")) == 1


def test_a_refused_checkpoint_is_refused_before_its_weights(hub, tmp_path):
    checkpoint(hub.root, "acme/tiny")
    with pytest.raises(DownloadRefused, match="no such architecture"):
        fetch(parse_hub_id("acme/tiny"), tmp_path / "cache", lambda d, n: ["no such architecture"])
    assert hub.fetched(".safetensors") == []


def test_pickled_weights_only_are_refused(hub, tmp_path):
    d = checkpoint(hub.root, "acme/old")
    (d / "model.safetensors").unlink()
    with pytest.raises(DownloadRefused, match="no safetensors weights.*pytorch_model.bin"):
        fetch(parse_hub_id("acme/old"), tmp_path / "cache", no_problem)


def test_a_disk_too_small_is_refused_before_downloading(hub, tmp_path, monkeypatch):
    checkpoint(hub.root, "acme/tiny")
    import service.models.hub_download as hub_download

    usage = hub_download.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(hub_download.shutil, "disk_usage", lambda p: usage._replace(free=1000))
    with pytest.raises(DownloadRefused, match="GiB free: refused before downloading"):
        fetch(parse_hub_id("acme/tiny"), tmp_path / "cache", no_problem)
    assert hub.fetched(".safetensors") == []


def test_a_gguf_tag_fetches_that_file_and_a_missing_tag_lists_those_there_are(hub, tmp_path):
    d = hub.root / "acme/m-GGUF"
    d.mkdir(parents=True)
    for tag in ("Q4_K_M", "Q8_0"):
        (d / f"m-{tag}.gguf").write_bytes(b"GGUF" + tag.encode() * 5_000)
    got = fetch(parse_hub_id("acme/m-GGUF:q8_0"), tmp_path / "cache", no_problem)
    assert got.path.name == "m-Q8_0.gguf" and got.path.read_bytes() == (d / "m-Q8_0.gguf").read_bytes()
    whole = [(path, rng) for method, path, rng in hub.requests if method == "GET" and path.endswith(".gguf")]
    assert [(path.rsplit("/", 1)[1], rng) for path, rng in whole] == [
        ("m-Q8_0.gguf", "bytes=0-1048575"),
        ("m-Q8_0.gguf", None),
    ]
    untagged = fetch(parse_hub_id("acme/m-GGUF"), tmp_path / "cache", no_problem)
    assert untagged.path.name == "m-Q4_K_M.gguf" and "as llama.cpp picks" in untagged.why
    with pytest.raises(DownloadRefused, match="has: Q4_K_M, Q8_0"):
        fetch(parse_hub_id("acme/m-GGUF:Q5_K_S"), tmp_path / "cache", no_problem)


def test_offline_serves_the_cache_or_says_downloads_are_off(hub, tmp_path):
    checkpoint(hub.root, "acme/tiny")
    cache = tmp_path / "cache"
    with pytest.raises(DownloadRefused, match="downloads are off"):
        fetch(parse_hub_id("acme/tiny"), cache, no_problem, offline=True)
    online = fetch(parse_hub_id("acme/tiny"), cache, no_problem)
    asked = len(hub.requests)
    offline = fetch(parse_hub_id("acme/tiny"), cache, no_problem, offline=True)
    assert offline.path == online.path and "offline" in offline.why and len(hub.requests) == asked  # no request


def test_a_killed_download_resumes_where_it_stopped(hub, tmp_path):
    d = hub.root / "acme/big-GGUF"
    d.mkdir(parents=True)
    data = os.urandom(40 << 20)
    (d / "big-Q8_0.gguf").write_bytes(data)
    hub.stall_after["big-Q8_0.gguf"] = 30 << 20  # then nothing: killed meanwhile
    cache = tmp_path / "cache"
    code = (
        "from pathlib import Path; from service.models.hub_download import fetch, parse_hub_id; "
        f"fetch(parse_hub_id('acme/big-GGUF:Q8_0'), Path({str(cache)!r}), lambda d, n: [])"
    )
    env = {**os.environ, "HF_ENDPOINT": os.environ["HF_ENDPOINT"], "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.DEVNULL)
    blobs = cache / "models--acme--big-GGUF" / "blobs"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # huggingface_hub writes 10 MiB chunks
        parts = list(blobs.glob("*.part")) if blobs.is_dir() else []
        if parts and parts[0].stat().st_size >= 20 << 20:
            break
        time.sleep(0.05)
    child.kill()
    child.wait()
    left = parts[0].stat().st_size
    got = fetch(parse_hub_id("acme/big-GGUF:Q8_0"), cache, no_problem)
    assert got.path.read_bytes() == data
    assert (hub.requests[-1][2] or "") == f"bytes={left}-", hub.requests[-3:]  # the rest only


def test_two_replicas_on_one_cache_fetch_a_file_once(hub, tmp_path):
    checkpoint(hub.root, "acme/tiny", weights=4 << 20)
    cache = tmp_path / "cache"
    got: list[Path | BaseException] = []

    def replica() -> None:
        try:
            got.append(fetch(parse_hub_id("acme/tiny"), cache, no_problem).path)
        except BaseException as exc:  # noqa: BLE001 (said by the assertion below)
            got.append(exc)

    threads = [threading.Thread(target=replica) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 2 and got[0] == got[1], got
    assert len(hub.fetched("model.safetensors")) == 1


def test_ollamas_store_gives_the_model_blob_in_place(tmp_path):
    blob = ollama_store(tmp_path, "qwen3", "0.6b", b"GGUF-qwen3")
    found = find_ollama_model("qwen3:0.6b", tmp_path)
    assert found.blob == blob and found.manifest == tmp_path / "manifests/registry.ollama.ai/library/qwen3/0.6b"
    hf = ollama_store(tmp_path, "org/name", "Q4_K_M", b"GGUF-hf", namespace="hf.co")
    assert find_ollama_model("hf.co/org/name:Q4_K_M", tmp_path).blob == hf
    assert manifest_path("qwen3", tmp_path).name == "latest"
    with pytest.raises(OllamaModelNotFound, match=r"no model 'llama3'.*it has: .*qwen3/0.6b"):
        find_ollama_model("llama3", tmp_path)


def gguf_of(path: Path, architecture: str) -> Path:
    """A small GGUF file of `architecture`, written by gguf-py (llama.cpp's writer): its header first."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_gguf_file_of_an_architecture_that_is_not_served_is_refused_on_its_header(hub, tmp_path):
    d = hub.root / "acme/lm-GGUF"
    d.mkdir(parents=True)
    gguf_of(d / "lm-F32.gguf", "stablelm")
    with open(d / "lm-F32.gguf", "ab") as f:
        f.write(os.urandom(3 << 20))  # weights past the header's first megabyte
    refusals = {"stablelm": "not checked against llama.cpp"}
    with pytest.raises(DownloadRefused, match="'stablelm' file: not checked against llama.cpp"):
        fetch(parse_hub_id("acme/lm-GGUF:F32"), tmp_path / "cache", no_problem, gguf_check=refusals.get)
    asked = [(rng or "") for method, path, rng in hub.requests if method == "GET" and path.endswith(".gguf")]
    assert asked == ["bytes=0-1048575"]  # its header only
    served = fetch(parse_hub_id("acme/lm-GGUF:F32"), tmp_path / "cache", no_problem, gguf_check=lambda a: None)
    assert served.path.read_bytes() == (d / "lm-F32.gguf").read_bytes()


def test_a_split_gguf_file_is_fetched_in_parts_and_merged_as_llama_cpp_merges_it(hub, tmp_path):
    """Parts written by gguf-py's own splitting writer (what llama.cpp's converter writes with --split-max-tensors)."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(0)
    tensors = {f"blk.{i}.attn_q.weight": rng.standard_normal((8, 16)).astype(np.float32) for i in range(3)}
    d = hub.root / "acme/split-GGUF"
    d.mkdir(parents=True)
    writer = gguf.GGUFWriter(d / "m-F32.gguf", "llama", split_max_tensors=1)
    writer.add_block_count(3)
    writer.add_context_length(64)
    for name, values in tensors.items():
        writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    parts = sorted(p.name for p in d.iterdir())
    assert parts == [f"m-F32-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    got = fetch(parse_hub_id("acme/split-GGUF:F32"), tmp_path / "cache", no_problem)
    assert "3 parts downloaded" in got.why
    merged = gguf.GGUFReader(got.path)
    assert {t.name: np.array(t.data).reshape(8, 16).tolist() for t in merged.tensors} == {
        n: v.tolist() for n, v in tensors.items()
    }
    assert merged.fields["llama.block_count"].contents() == 3 and not any(k.startswith("split.") for k in merged.fields)
    again = fetch(parse_hub_id("acme/split-GGUF:F32"), tmp_path / "cache", no_problem)
    assert again.path == got.path and "merged, in the cache" in again.why
    offline = fetch(parse_hub_id("acme/split-GGUF:F32"), tmp_path / "cache", no_problem, offline=True)
    assert offline.path == got.path
    (d / parts[1]).unlink()
    with pytest.raises(DownloadRefused, match="lacks m-F32-00002-of-00003.gguf"):
        fetch(parse_hub_id("acme/split-GGUF:F32"), tmp_path / "cache2", no_problem)


@pytest.mark.parametrize("asked", ["../x", "./x", "acme/..", "acme/.", "acme/x@..", "acme/x@.", "../x:Q8_0"])
def test_a_hub_id_of_a_dot_or_dot_dot_part_is_no_hub_id(asked):
    """Each part names a folder of the cache: `..` would name one outside it."""
    assert parse_hub_id(asked) is None
    assert parse_hub_id("acme/x.y@v1.0:Q8_0") == HubSpec("acme/x.y", "v1.0", "Q8_0")  # dots within a part are names


def outside(tmp_path: Path, cache: Path) -> list[Path]:
    """The files written under tmp_path but outside the cache and the hub's own files."""
    return [p for p in tmp_path.rglob("*") if p.is_file() and cache not in p.parents and "hub" not in p.parts]


def test_a_commit_that_is_not_40_hex_digits_is_refused_before_it_names_a_folder(hub, tmp_path):
    checkpoint(hub.root, "acme/tiny")
    hub.commit = "../../../escaped"
    cache = tmp_path / "cache"
    with pytest.raises(DownloadRefused, match=r"the commit '\.\./\.\./\.\./escaped', not 40 hexadecimal digits"):
        fetch(parse_hub_id("acme/tiny"), cache, no_problem)
    assert outside(tmp_path, cache) == [] and not (tmp_path / "escaped").exists()
    assert hub.fetched("") == []


def test_an_etag_that_is_not_a_hash_is_refused_before_it_names_a_blob(hub, tmp_path):
    for tag in ("Q8_0", "Q4_0"):
        d = hub.root / "acme/m-GGUF"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"m-{tag}.gguf").write_bytes(b"GGUF" + tag.encode() * 10_000)
    cache = tmp_path / "cache"
    # the hub's own ETag comes in quotes, which huggingface_hub strips: a hash in quotes is a hash
    got = fetch(parse_hub_id("acme/m-GGUF:Q4_0"), cache, no_problem)
    assert got.path.resolve().parent.name == "blobs" and len(got.path.resolve().name) == 64
    hub.etags["m-Q8_0.gguf"] = "../../../escaped"  # from the blobs folder: beside the cache
    with pytest.raises(DownloadRefused, match=r"the ETag '\.\./\.\./\.\./escaped', not a git or sha256 hash"):
        fetch(parse_hub_id("acme/m-GGUF:Q8_0"), cache, no_problem)
    assert outside(tmp_path, cache) == []
    assert hub.requests[-1][0] == "HEAD"  # refused on the file's metadata, before the file is fetched


@pytest.mark.parametrize(
    "listed", ["../../../../escaped.safetensors", "{tmp}/escaped.safetensors", "a\\b.safetensors", "a//b.safetensors"]
)
def test_a_file_name_that_is_not_a_path_inside_the_repo_is_refused_before_anything_is_fetched(hub, tmp_path, listed):
    checkpoint(hub.root, "acme/tiny")
    hub.listed_as["model.safetensors"] = listed.format(tmp=tmp_path)  # the first two would land beside the cache
    cache = tmp_path / "cache"
    with pytest.raises(DownloadRefused, match="which is not a path inside the repo"):
        fetch(parse_hub_id("acme/tiny"), cache, no_problem)
    assert hub.fetched("") == [] and outside(tmp_path, cache) == []


def test_a_reply_longer_than_the_bytes_asked_for_is_cut_off_and_never_held(hub, tmp_path):
    """A server that ignores the Range sends the whole file: its first megabyte is read, the rest never held."""
    import tracemalloc

    from service.models import hub_download
    from tests.support.hub_server import COMMIT

    d = hub.root / "acme/big-GGUF"
    d.mkdir(parents=True)
    gguf_of(d / "big-F32.gguf", "stablelm")
    with open(d / "big-F32.gguf", "ab") as f:
        f.write(b"\0" * (48 << 20))
    hub.ignore_range.add("big-F32.gguf")
    hub_download._first_bytes("acme/big-GGUF", "big-F32.gguf", COMMIT, 16)  # the client's session, made once
    tracemalloc.start()
    try:
        head = hub_download._first_bytes("acme/big-GGUF", "big-F32.gguf", COMMIT, hub_download.HEADER_BYTES)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert head == (d / "big-F32.gguf").read_bytes()[: hub_download.HEADER_BYTES]
    assert peak < 8 << 20, f"{peak / 2**20:.1f} MiB held for a 1 MiB head"
    assert hub.requests[-1][2] == "bytes=0-1048575"  # asked for its first megabyte, sent it whole
    with pytest.raises(DownloadRefused, match="'stablelm' file"):  # and the header still checked
        fetch(parse_hub_id("acme/big-GGUF:F32"), tmp_path / "cache", no_problem, gguf_check={"stablelm": "no"}.get)


@pytest.mark.parametrize(
    "name",
    ["../../m:x", "/etc/m:x", "a/../../m", "..:x", ".", "m:..", "a//m", "h/n/m/extra", "ns.dot/m", "m:x:y", "m@sha"],
)
def test_an_ollama_name_ollama_would_not_take_is_refused_before_it_names_a_manifest(tmp_path, name):
    store = tmp_path / "store"
    ollama_store(store, "m", "latest", b"GGUF-m")
    # what `../../m:x` reads today, outside the store: a manifest there naming a blob in it
    escaped = tmp_path / "m" / "x"
    escaped.parent.mkdir(parents=True)
    escaped.write_text((store / "manifests/registry.ollama.ai/library/m/latest").read_text())
    with pytest.raises(OllamaModelNotFound, match="is not an Ollama model name"):
        find_ollama_model(name, store)


def manifest_naming(store: Path, digest: str) -> None:
    manifest = store / "manifests/registry.ollama.ai/library/m/latest"
    layers = [{"mediaType": "application/vnd.ollama.image.model", "digest": digest, "size": 1}]
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))


def test_a_manifest_digest_that_is_not_sha256_hex_is_refused_before_it_names_a_blob(tmp_path):
    store = tmp_path / "store"
    ollama_store(store, "m", "latest", b"GGUF-m")
    secret = tmp_path / "secret"
    secret.write_bytes(b"not a model")
    for digest in (str(secret), f"sha256:../../{secret.name}", "sha256:" + "A" * 64, "sha512:" + "0" * 64):
        manifest_naming(store, digest)
        with pytest.raises(OllamaModelNotFound, match=r"not sha256:<64 hexadecimal digits>"):
            find_ollama_model("m", store)


def test_a_blob_linked_outside_ollamas_blobs_is_refused(tmp_path):
    store = tmp_path / "store"
    blob = ollama_store(store, "m", "latest", b"GGUF-m")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"GGUF-m")
    blob.unlink()
    blob.symlink_to(elsewhere)
    with pytest.raises(OllamaModelNotFound, match="outside Ollama's blobs"):
        find_ollama_model("m", store)
    # a store whose blobs folder is itself a link (another disk) is the store
    moved = tmp_path / "disk" / "blobs"
    moved.parent.mkdir()
    blob.unlink()
    (store / "blobs").rename(moved)
    (store / "blobs").symlink_to(moved)
    (moved / blob.name).write_bytes(b"GGUF-m")
    assert find_ollama_model("m", store).sha256 == blob.name.removeprefix("sha256-")
