"""What a complete checkpoint or final/ directory holds: a manifest of every file's size and SHA-256.

A saved directory (``checkpoint-<N>/``, ``final/``) gets a manifest, written last, as JSON::

    {"step": N, "files": {relative path: bytes}, "sha256": {relative path: hex digest}}

The digests are taken when the directory is saved (right after the writes, from the page cache), so a later
change of content is found whatever happens to sizes and mtimes: a bit flip, weights replaced by others of the
same size, a restored mtime. :func:`verify` checks a directory against its manifest: a missing file, another size
(cheap, first), another digest (``content=True``: reads every byte), then each file's structure (a safetensors
header whose offsets run past the end, a torch.save zip without its central directory, JSON that does not
parse). Manifests of an older stapo (sizes only, or the bare step number) get the checks they allow.

Cost (benchmarks/bench_checksums.py, Qwen3-1.7B's shape, 3.44 GB of bf16 weights, a shared 2-core VM): 0.76 GB/s,
1.3 s per GB saved (+27-34 % of the save's own time); a checkpoint's files are hashed in parallel threads
(hashlib releases the GIL), one file per thread.

Standard library only: the evaluation preflight verifies its input before lm-eval or torch load.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from stapo.core import bounded
from stapo.core.atomic import atomic_write_json

__all__ = ["COMPLETE", "FINAL_COMPLETE", "SNAPSHOT_COMPLETE", "cut_files", "WEIGHTS", "file_sha256", "digests",
           "model_files", "write_manifest", "read_manifest", "verify", "problems"]

COMPLETE = "STAPO_CHECKPOINT_COMPLETE"  # checkpoint manifest, written after every rank has saved
FINAL_COMPLETE = "STAPO_FINAL_COMPLETE"  # final/ manifest, written into the temporary dir before the rename
SNAPSHOT_COMPLETE = "STAPO_SNAPSHOT_COMPLETE"  # snapshot-N/ manifest (evaluation weights), likewise
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
# Files whose bytes decide what a loaded model generates (weights, their index, config, tokenizer) ...
MODEL_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".json", ".model", ".txt", ".jinja")
# ... except a checkpoint's training state, which only resuming reads, and TRL's pickled TrainingArguments, which
# name the run (output_dir, run_name): two runs that reach the same weights must sample the same completions
TRAINING_STATE = ("optimizer.pt", "scheduler.pt", "scaler.pt", "trainer_state.json", "rng_state", "training_args.bin")
_BLOCK = 8 << 20  # bytes per read while hashing
_THREADS = max(1, min(4, os.cpu_count() or 1))


def file_sha256(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's bytes (read in 8 MB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(_BLOCK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def digests(directory: str | os.PathLike, names: list[str]) -> dict[str, str]:
    """{name: SHA-256} of files under ``directory``, hashed in parallel threads."""
    directory = Path(directory)
    with ThreadPoolExecutor(_THREADS) as pool:
        return dict(zip(names, pool.map(lambda n: file_sha256(directory / n), names)))


def model_files(directory: str | os.PathLike) -> list[str]:
    """The files of ``directory`` (top level) a loaded model is made of, sorted: not a checkpoint's training state."""
    return sorted(p.name for p in Path(directory).iterdir() if p.is_file() and p.suffix in MODEL_SUFFIXES
                  and not p.name.startswith(TRAINING_STATE))


def _files(directory: Path, sentinel: str) -> list[str]:
    return [str(p.relative_to(directory)) for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name != sentinel]


def write_manifest(directory: str | os.PathLike, sentinel: str, step: int) -> dict:
    """Write ``directory/sentinel``: every file's size and SHA-256 (the sentinel itself excluded)."""
    directory = Path(directory)
    names = _files(directory, sentinel)
    manifest = {"step": step, "files": {n: (directory / n).stat().st_size for n in names},
                "sha256": digests(directory, names)}
    atomic_write_json(directory / sentinel, manifest, inside=directory)
    return manifest


def read_manifest(directory: str | os.PathLike, sentinel: str) -> dict | None:
    """The manifest as a dict ({} for the old bare-step format), or None when there is none."""
    mark = Path(directory) / sentinel
    if not mark.is_file():
        return None
    try:
        manifest = bounded.load_json(mark, what="a manifest")
    except (ValueError, OSError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def _cut(path: Path) -> str | None:
    """Why ``path`` is structurally incomplete (a truncated write), or None. Reads headers only, never tensors."""
    size = path.stat().st_size
    try:
        if path.suffix == ".safetensors":
            with path.open("rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(n))
            end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
            return None if size >= 8 + n + end else f"{size} bytes, header needs {8 + n + end}"
        if path.suffix in (".pt", ".pth", ".bin"):  # torch.save writes a zip; cut files lose the central directory
            return None if zipfile.is_zipfile(path) else "not a complete torch.save archive"
        if path.suffix == ".json":
            json.loads(path.read_bytes())
    except (struct.error, ValueError, KeyError, TypeError, IndexError, OSError) as err:
        return f"unreadable ({type(err).__name__})"
    return None


def cut_files(directory: str | os.PathLike) -> list[str]:
    """``name: why`` of each weight, config or tokenizer file of a model directory that is structurally incomplete
    (:func:`_cut`: headers only): what a directory without a manifest can still be checked for."""
    directory = Path(directory)
    return [f"{name}: {why}" for name in model_files(directory) if (why := _cut(directory / name))]


def verify(directory: str | os.PathLike, sentinel: str = COMPLETE, *,
           content: bool | list[str] = True) -> tuple[list[str], dict[str, str]]:
    """(what makes ``directory`` not intact, [] when intact; the SHA-256 of every file it checked).

    Intact: the manifest exists, every file it lists is there with its size and (``content``: all files, or those
    named) its SHA-256, weights are present, and no safetensors / torch.save / JSON file is structurally cut.
    Digests are computed only for files whose size matches.
    """
    directory = Path(directory)
    manifest, found, checked = read_manifest(directory, sentinel), [], {}
    if manifest is None:
        found.append(f"no {sentinel} (the save did not finish)")
    sizes, sums = (manifest or {}).get("files", {}), (manifest or {}).get("sha256", {})
    same_size = []
    for name, size in sizes.items():
        path = directory / name
        if not path.is_file():
            found.append(f"{name} missing")
        elif path.stat().st_size != size:
            found.append(f"{name} has {path.stat().st_size} bytes, {size} were written")
        else:
            same_size.append(name)
    if content and sums:
        wanted = same_size if content is True else [n for n in same_size if n in content]
        checked = digests(directory, [n for n in wanted if n in sums])
        found += [f"{n} content differs from its SHA-256 at save time (damaged after it was written)"
                  for n, h in checked.items() if h != sums[n]]
    if not any((directory / w).is_file() for w in WEIGHTS):
        found.append("no weights file")
    for path in sorted(directory.rglob("*")):
        why = _cut(path) if path.is_file() and path.name != sentinel else None
        if why:
            found.append(f"{path.relative_to(directory)} {why}")
    return sorted(set(found)), checked


def problems(directory: str | os.PathLike, sentinel: str = COMPLETE, *, content: bool = True) -> list[str]:
    """What makes ``directory`` not intact (:func:`verify`); [] when intact."""
    return verify(directory, sentinel, content=content)[0]
