"""Hub ids downloaded on first start, as `vllm serve` and llama.cpp's `-hf` do, into the Hugging Face cache (HF_HOME).

- `org/name[@revision]`: a Hugging Face checkpoint, only the files serving needs (config, tokenizer, chat template,
  safetensors; never `*.bin` or `original/`). Its metadata comes first, and `preflight` (the start-up's full check:
  architecture, memory fit, kernels, quantization method) runs on it before any weight is fetched.
- `org/name[@revision]:TAG`: the one GGUF file of a GGUF repo whose name carries TAG (case-insensitive), as
  `llama-server -hf org/name:Q4_K_M`; no tag on a GGUF-only repo picks what llama.cpp picks.

Through huggingface_hub: HF_TOKEN for gated models, HF_ENDPOINT for mirrors, HF_HUB_OFFLINE, its cache layout. The
files come through `_resumable` rather than hf_hub_download, whose partial files are unique per process
(huggingface_hub 2.x, PR 4228): a killed start would fetch gigabytes again. Ours keep one `.part` per blob, resumed
with a Range request on the next start, under a lock, so that two replicas on one cache fetch a file once.

What the hub answers becomes parts of paths (the commit, each file's ETag and name): each is checked first, so that
an endpoint that is not the hub (HF_ENDPOINT) cannot name a path outside the cache.
"""

from __future__ import annotations

import fcntl
import fnmatch
import hashlib
import logging
import os
import re
import shutil
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("service.models.hub_download")

PREFIX = "hf:"  # a hub id written so, where it could be read as a path too
# `org/name`, then `@revision`, then `:TAG` (a GGUF quant tag)
_SPEC = re.compile(r"^(?P<repo>[\w.-]+/[\w.-]+)(?:@(?P<revision>[\w.-]+))?(?::(?P<tag>[\w.-]+))?$")
SERVING_FILES = ("*.json", "*.safetensors", "tokenizer.model", "*.tiktoken", "*.jinja", "merges.txt", "vocab.txt")
NEVER = ("original/*", "*.bin", "*.pt", "*.pth", "*.onnx", "*.msgpack", "*.h5", "*.gguf")
# llama.cpp's choice (common/download.cpp find_best_model): the tag, or without one Q4_K_M, then Q8_0, else the
# first model file; a tag matches as `TAG[.-]` anywhere in the path, case-insensitive; mmproj, imatrix and draft
# files are not models.
DEFAULT_TAGS = ("Q4_K_M", "Q8_0")
NOT_MODELS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
PROGRESS_SECONDS = 5.0
_COMMIT = re.compile(r"[0-9a-f]{40}")  # a git commit, as the hub names a revision's snapshot
_ETAG = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # a git blob's sha1, or an LFS file's sha256


class DownloadRefused(ValueError):
    """A model that cannot be served, or does not fit, refused before its weights are fetched."""


@dataclass(frozen=True)
class HubSpec:
    repo: str
    revision: str | None = None
    tag: str | None = None

    def __str__(self) -> str:
        return self.repo + (f"@{self.revision}" if self.revision else "") + (f":{self.tag}" if self.tag else "")


@dataclass(frozen=True)
class Fetched:
    path: Path  # a snapshot directory, or a GGUF file in the cache
    why: str  # what was fetched, or found in the cache, and why that file


def parse_hub_id(model: str) -> HubSpec | None:
    """`org/name[@revision][:TAG]`, else None. An org, name or revision `.` or `..` is a path's part, never a hub
    id's: it would name a folder outside the cache's."""
    m = _SPEC.match(model)
    if m is None or {*m["repo"].split("/"), m["revision"]} & {".", ".."}:
        return None
    return HubSpec(m["repo"], m["revision"], m["tag"])


def pick_gguf(files: list[str], tag: str | None) -> tuple[str, str]:
    """The file of `tag` among a repo's GGUF files (case-insensitive, as a name part), or llama.cpp's default."""
    ggufs = [f for f in files if f.endswith(".gguf") and not any(n in f.rsplit("/", 1)[-1] for n in NOT_MODELS)]
    if not ggufs:
        raise DownloadRefused("the repo has no GGUF file")

    def tagged(t: str) -> list[str]:
        pattern = re.compile(re.escape(t) + "[.-]", re.I)
        return [f for f in ggufs if pattern.search(f) and not _later_part(f)]

    if tag:
        found = tagged(tag)
        if not found:
            raise DownloadRefused(f"no GGUF file tagged {tag!r}; the repo has: {', '.join(tags_of(ggufs))}")
        why = f"the file tagged {tag}"
    else:
        found = next((tagged(t) for t in DEFAULT_TAGS if tagged(t)), [f for f in ggufs if not _later_part(f)][:1])
        why = f"no tag given: {found[0]}, as llama.cpp picks ({' then '.join(DEFAULT_TAGS)}, else the first file)"
    return found[0], why


def split_parts(first: str, files: list[str]) -> list[str]:
    """The parts of a split GGUF file (`name-00001-of-00003.gguf`, llama.cpp's gguf-split), in order; [first] for a
    file that is not split. A part missing from the repo refuses it."""
    m = _SPLIT.search(first)
    if m is None:
        return [first]
    count, stem = int(m[2]), first[: m.start()]
    parts = [f"{stem}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]
    missing = [p for p in parts if p not in files]
    if missing:
        raise DownloadRefused(f"{first} is split in {count} parts, and the repo lacks {', '.join(missing)}")
    return parts


def merge_split(parts: list[Path], out: Path) -> Path:
    """Split parts as one GGUF file, as `llama-gguf-split --merge` makes it: the first part's metadata without its
    split.* keys, then every part's tensors in order, written by gguf-py (the service reads one file). Atomic."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    readers = [GGUFReader(p) for p in parts]
    first = readers[0]
    architecture = str(first.fields["general.architecture"].contents())
    staging = out.with_name(f".{out.name}.{os.getpid()}.partial")
    writer = GGUFWriter(staging, architecture)
    for name, field in first.fields.items():
        if name.startswith(("GGUF.", "split.")) or name == "general.architecture":
            continue
        sub_type = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), field.types[0], sub_type=sub_type)
    for reader in readers:
        for tensor in reader.tensors:
            writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(staging, out)
    return out


def _merged_path(repo_dir: Path, commit: str, first: str) -> Path:
    m = _SPLIT.search(first)
    stem = first[: m.start()] if m else first.removesuffix(".gguf")
    return repo_dir / "merged" / commit / f"{Path(stem).name}.gguf"


def _later_part(name: str) -> bool:
    m = _SPLIT.search(name)
    return m is not None and int(m[1]) != 1


def tags_of(files: list[str]) -> list[str]:
    """The quant tags a repo's GGUF file names carry (Q4_K_M, Q8_0, ...), for a refusal to list."""
    found = (re.search(r"((?:I?Q\d\w*)|BF16|F16|F32)(?=\.gguf$|-\d{5}-of-)", f, re.I) for f in files)
    return sorted({m[1].upper() for m in found if m}) or files


def _serving(files: dict[str, int]) -> dict[str, int]:
    return {
        f: size
        for f, size in files.items()
        if any(fnmatch.fnmatch(f, p) for p in SERVING_FILES) and not any(fnmatch.fnmatch(f, p) for p in NEVER)
    }


def _check_disk(cache: Path, needed: int, what: str) -> None:
    cache.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(cache).free
    if needed > free:
        raise DownloadRefused(
            f"{what} needs {needed / 2**30:.2f} GiB and {cache} has {free / 2**30:.2f} GiB free: refused before "
            "downloading"
        )


@contextmanager
def _progress(repo_dir: Path, total: int, what: str, progress: Callable[[str], None]) -> Iterator[None]:
    """A log line every few seconds, also handed to `progress` (/ready's reason meanwhile): bytes on disk under the
    repo's cache folder, finished and partial."""
    done = threading.Event()
    start = time.monotonic()
    base = _bytes_under(repo_dir)
    progress(f"downloading {what}: 0% of {total / 1e6:.1f} MB")

    def report() -> None:
        while not done.wait(PROGRESS_SECONDS):
            got = _bytes_under(repo_dir) - base
            rate = got / max(time.monotonic() - start, 1e-6)
            line = (
                f"downloading {what}: {100 * got // max(total, 1)}% ({got / 1e6:.1f} of {total / 1e6:.1f} MB, "
                f"{rate / 1e6:.1f} MB/s)"
            )
            log.info("%s", line)
            progress(line)

    thread = threading.Thread(target=report, name="download-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _bytes_under(directory: Path) -> int:
    return (
        sum(p.stat().st_size for p in directory.rglob("*") if p.is_file() and not p.is_symlink())
        if directory.is_dir()
        else 0
    )


def gguf_architecture(head: bytes) -> str | None:
    """`general.architecture` from a GGUF file's first bytes (its header), None where it is not among them. By hand:
    gguf-py's reader maps the whole file, and this runs before the file is here. llama.cpp writes the key first."""
    if head[:4] != b"GGUF" or struct.unpack_from("<I", head, 4)[0] < 2:
        return None
    (n_kv,) = struct.unpack_from("<Q", head, 16)
    off = 24
    try:
        for _ in range(n_kv):
            (key_len,) = struct.unpack_from("<Q", head, off)
            key = head[off + 8 : off + 8 + key_len]
            (kind,) = struct.unpack_from("<I", head, off + 8 + key_len)
            off += 12 + key_len
            if kind == _GGUF_STRING:
                (n,) = struct.unpack_from("<Q", head, off)
                if key == b"general.architecture":
                    return head[off + 8 : off + 8 + n].decode()
                off += 8 + n
            elif kind in _GGUF_SCALAR_BYTES:
                off += _GGUF_SCALAR_BYTES[kind]
            else:  # an array before the architecture: not llama.cpp's order
                return None
    except struct.error:  # the header runs past the bytes read
        return None
    return None


_GGUF_STRING = 8  # gguf-py's GGUFValueType: sizes of the scalar types, the string type
_GGUF_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
HEADER_BYTES = 1 << 20


def _first_bytes(repo: str, name: str, commit: str, n: int) -> bytes:
    """The file's first `n` bytes. Read as they stream in and cut off at `n`: a server that ignores the Range sends
    the whole file, which is never held. Raw and unencoded, so that no compressed reply is inflated past `n` either."""
    from huggingface_hub import get_session, hf_hub_url
    from huggingface_hub.utils._headers import build_hf_headers

    headers = build_hf_headers() | {"Range": f"bytes=0-{n - 1}", "Accept-Encoding": "identity"}
    head = bytearray()
    url = hf_hub_url(repo, name, revision=commit)
    with get_session().stream("GET", url, headers=headers, follow_redirects=True) as response:
        response.raise_for_status()
        for chunk in response.iter_raw():
            head += chunk[: n - len(head)]
            if len(head) >= n:
                break
    return bytes(head)


def _commit(sha: str | None, where: str) -> str:
    """A commit the hub answered (or `where` kept it), checked before it names the snapshot's folder."""
    if sha is None or not _COMMIT.fullmatch(sha):
        raise DownloadRefused(f"{where} names the commit {sha!r}, not 40 hexadecimal digits: refused")
    return sha


def _file_name(name: str) -> str:
    """A file the hub lists, checked before it names a path in the snapshot: relative, inside the repo."""
    if not name or name.startswith("/") or "\\" in name or {"", ".", ".."} & set(name.split("/")):
        raise DownloadRefused(f"the hub lists a file {name!r}, which is not a path inside the repo: refused")
    return name


def fetch(
    spec: HubSpec,
    cache: Path,
    preflight: Callable[[Path, int], list[str]],
    offline: bool = False,
    gguf_check: Callable[[str], str | None] = lambda architecture: None,
    progress: Callable[[str], None] = lambda line: None,
) -> Fetched:
    """The model of `spec` in `cache` (HF_HUB_CACHE), downloaded unless it is there. `preflight(directory,
    weight_bytes)` returns the problems that refuse a checkpoint, checked on its metadata before its weights come;
    `gguf_check(architecture)` the problem that refuses a GGUF file, checked on its header's first megabyte."""
    from huggingface_hub import HfApi, constants, hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    if offline:
        return _cached(spec, cache)
    info = HfApi().model_info(spec.repo, revision=spec.revision, files_metadata=True)
    commit = _commit(info.sha, f"the hub ({constants.ENDPOINT})")
    files = {_file_name(s.rfilename): int(s.size or 0) for s in info.siblings or []}
    repo_dir = cache / f"models--{spec.repo.replace('/', '--')}"
    # The branch or tag asked for, as huggingface_hub records it: what an offline start finds the snapshot by
    ref = repo_dir / "refs" / (spec.revision or "main")
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(commit)
    has_weights = any(f.endswith(".safetensors") for f in files)
    if spec.tag or (not has_weights and any(f.lower().endswith(".gguf") for f in files)):
        name, why = pick_gguf(list(files), spec.tag)
        parts = split_parts(name, list(files))
        merged = _merged_path(repo_dir, commit, name)
        if len(parts) > 1 and merged.is_file():
            return Fetched(merged, f"{why}, {len(parts)} parts merged, in the cache")
        if len(parts) == 1:
            try:  # already complete in the cache: no disk check, no transfer
                cached = hf_hub_download(spec.repo, name, revision=commit, cache_dir=cache, local_files_only=True)
                return Fetched(Path(cached), f"{why}, in the cache")
            except LocalEntryNotFoundError:
                pass
        architecture = gguf_architecture(_first_bytes(spec.repo, name, commit, HEADER_BYTES))
        if architecture is not None and (problem := gguf_check(architecture)):
            raise DownloadRefused(f"{name} is a {architecture!r} file: {problem}")
        size = sum(files[p] for p in parts)
        _check_disk(cache, size * (2 if len(parts) > 1 else 1), f"{spec.repo}/{name}")  # a split one is merged
        with _progress(repo_dir, size, f"{spec.repo}/{name}", progress):
            paths = [_resumable(spec.repo, part, commit, cache) for part in parts]
        if len(parts) == 1:
            return Fetched(paths[0], f"{why}, downloaded from {spec.repo}@{commit}")
        merged.parent.mkdir(parents=True, exist_ok=True)
        with open(merged.with_name(merged.name + ".service-lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another replica merging it: wait, then find it done
            if not merged.is_file():
                log.info("merging the %d parts of %s into %s", len(parts), name, merged)
                merge_split(paths, merged)
        return Fetched(merged, f"{why}, {len(parts)} parts downloaded from {spec.repo}@{commit} and merged")
    serving = _serving(files)
    weights = {f: s for f, s in serving.items() if f.endswith(".safetensors")}
    if not weights:
        others = sorted(f for f in files if f.endswith((".bin", ".pt", ".pth", ".gguf")))
        raise DownloadRefused(
            f"{spec.repo} has no safetensors weights"
            + (
                f" (it has {', '.join(others[:5])}: pickled weights are never loaded; a GGUF repo takes a :TAG)"
                if others
                else ""
            )
        )
    directory = repo_dir / "snapshots" / commit
    directory.mkdir(parents=True, exist_ok=True)
    for name in [f for f in serving if f not in weights]:  # the metadata, which the pre-flight reads
        _resumable(spec.repo, name, commit, cache)
    problems = preflight(directory, sum(weights.values()))
    if problems:
        raise DownloadRefused("; ".join(problems))
    missing = {f: s for f, s in weights.items() if not (directory / f).is_file()}
    if missing:
        _check_disk(cache, sum(missing.values()), f"{spec.repo}'s weights")
    with _progress(repo_dir, sum(missing.values()), spec.repo, progress):
        for name in missing:
            _resumable(spec.repo, name, commit, cache)
    return Fetched(
        directory, f"downloaded from {spec.repo}@{commit}" if missing else f"{spec.repo}@{commit}, in the cache"
    )


def _resumable(repo: str, name: str, commit: str, cache: Path) -> Path:
    """`name` at `commit` into the HF cache layout (blobs/<etag>, snapshots/<commit>/<name> linking to it), resuming a
    `.part` an earlier start left, checked against the hub's sha256 where the hub gives one (its large files). A file
    linked already is complete: no request."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils._headers import build_hf_headers

    repo_dir = cache / f"models--{repo.replace('/', '--')}"
    link = repo_dir / "snapshots" / commit / name
    if link.is_file():
        return link
    url = hf_hub_url(repo, name, revision=commit)
    meta = get_hf_file_metadata(url)  # its ETag without quotes (huggingface_hub's _normalize_etag)
    if not meta.etag or not _ETAG.fullmatch(meta.etag):
        raise DownloadRefused(
            f"the hub gave {repo}/{name} the ETag {meta.etag!r}, not a git or sha256 hash (40 or 64 hexadecimal "
            "digits): refused"
        )
    blob = repo_dir / "blobs" / meta.etag
    blob.parent.mkdir(parents=True, exist_ok=True)
    part = blob.with_name(blob.name + ".part")
    with open(blob.with_name(blob.name + ".service-lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another replica fetching it: wait, then find it done
        if not blob.is_file():
            resume = part.stat().st_size if part.is_file() else 0
            if resume:
                log.info("resuming %s/%s from %.1f MB", repo, name, resume / 1e6)
            with part.open("ab") as out:
                http_get(url, out, resume_size=resume, headers=build_hf_headers(), expected_size=meta.size)
            if len(meta.etag) == 64 and _sha256(part) != meta.etag:
                part.unlink()
                raise DownloadRefused(f"{repo}/{name} arrived with another sha256 than the hub's: removed, retry")
            os.replace(part, blob)
    link.parent.mkdir(parents=True, exist_ok=True)
    try:
        link.symlink_to(os.path.relpath(blob, link.parent))
    except FileExistsError:  # linked already, by an earlier start or the other replica
        pass
    return link


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _cached(spec: HubSpec, cache: Path) -> Fetched:
    """Offline: the snapshot the cache holds for the revision (refs/<revision> names its commit, as huggingface_hub
    lays the cache out), or for a tag the GGUF file in it; else a refusal that says so. Read from the layout, not
    snapshot_download, which counts the files never fetched (*.bin, original/) as missing."""
    repo_dir = cache / f"models--{spec.repo.replace('/', '--')}"
    revision = spec.revision or "main"
    ref = repo_dir / "refs" / revision
    snapshot = repo_dir / "snapshots" / (_commit(ref.read_text().strip(), str(ref)) if ref.is_file() else revision)
    offline = "downloads are off (HF_HUB_OFFLINE=1 or download=never)"
    ggufs = sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*.gguf")) if snapshot.is_dir() else []
    if spec.tag or (ggufs and not any(snapshot.glob("*.safetensors"))):
        try:
            name, why = pick_gguf(ggufs, spec.tag)
        except DownloadRefused as exc:
            raise DownloadRefused(f"{spec}: {exc} in the Hugging Face cache {cache}, and {offline}") from exc
        if _SPLIT.search(name):
            merged = _merged_path(repo_dir, snapshot.name, name)
            if not merged.is_file():
                raise DownloadRefused(f"{spec}: {name}'s parts are not merged in the cache {cache}, and {offline}")
            return Fetched(merged, f"{why}, merged, in the cache (offline)")
        return Fetched(snapshot / name, f"{why}, in the cache (offline)")
    if not (snapshot / "config.json").is_file() or not any(snapshot.glob("*.safetensors")):
        raise DownloadRefused(f"{spec} is not in the Hugging Face cache {cache}, and {offline}")
    return Fetched(snapshot, f"{spec}, in the cache (offline)")
