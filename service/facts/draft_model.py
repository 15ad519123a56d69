"""A draft model's or an EAGLE head's directory (the speculative setting) -> what vLLM would load from it and run: its
config, its weight files, the model code its config names. Read without loading a weight."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from service.facts.json_file import read_json
from service.facts.safetensors_header import read_header

PICKLED = ("*.bin", "*.pt", "*.pth")  # torch.load's formats, whose unpickling can run code


@dataclass(frozen=True)
class DraftFacts:
    path: str  # the directory, absolute: what vLLM is handed
    is_dir: bool
    has_config: bool  # config.json
    remote_code: tuple[str, ...]  # the classes config.json's auto_map names: code shipped in the directory
    safetensors: tuple[str, ...]  # its safetensors files
    pickled: tuple[str, ...]  # its pickled weight files (PICKLED)
    problems: tuple[str, ...] = ()  # a config.json that is not JSON, safetensors files that cannot load


def read_draft(directory: str) -> DraftFacts:
    """`directory` as the setting names it (`~` expanded, relative to the working directory)."""
    path = Path(directory).expanduser().absolute()
    if not path.is_dir():
        return DraftFacts(str(path), False, False, (), (), ())
    config = path / "config.json"
    problems = []
    try:
        auto_map = read_json(config).get("auto_map") if config.is_file() else None
    except ValueError as exc:
        auto_map, problems = None, [str(exc)]
    safetensors = sorted(p for p in path.glob("*.safetensors") if p.is_file())
    for shard in safetensors:
        try:
            read_header(shard)
        except ValueError as exc:
            problems.append(str(exc))
    pickled = sorted(p.name for pattern in PICKLED for p in path.glob(pattern) if p.is_file())
    return DraftFacts(
        str(path),
        True,
        config.is_file(),
        _classes(auto_map),
        tuple(p.name for p in safetensors),
        tuple(pickled),
        tuple(problems),
    )


def _classes(auto_map: object) -> tuple[str, ...]:
    """auto_map's entries (`{"AutoConfig": "configuration_x.XConfig", ...}`), or the value itself where it is not a
    mapping: any of them is code transformers imports from the directory."""
    if not auto_map:
        return ()
    if isinstance(auto_map, dict):
        return tuple(sorted(str(v) for v in auto_map.values()))
    return (str(auto_map),)
