"""The run directory of one ``stapo train`` run: what a complete one holds, what a rerun resumes from, and when
the run is done. No model is loaded here; the trainer calls these around ``trainer.train()``.

Layout of DIR (``runs/<model>/<method>``):
    config.yaml         the resolved config the run was STARTED with (model, method, train, trl). A rerun whose
                        config differs in anything that changes the weights refuses (:class:`RunConfigMismatch`)
                        rather than resume one config's optimiser state under another; ``--restart`` moves the
                        old run aside (``superseded-<UTC time>/``) and starts afresh.
    metrics.jsonl       one JSON line per optimiser step (+ the token diagnostics' files), appended and fsynced.
    checkpoint-<N>/     HF Trainer checkpoints. ``STAPO_CHECKPOINT_COMPLETE`` is written last, once every rank
                        has saved: a JSON manifest {step, files: {relative path: size in bytes}}.
    final/              weights + tokenizer, written through a temporary sibling and one rename, with its own
                        manifest ``STAPO_FINAL_COMPLETE``. The run is done iff final/ verifies.

What a kill (or a full disk) can leave, and what a rerun does with it:
    a checkpoint without its manifest, with a file shorter than the manifest says, or with a file that is
    structurally cut (safetensors header offsets past the end, a torch.save zip without its central directory,
    JSON that does not parse) is not "intact": the rerun resumes from the newest intact one and removes the others
    (logged). A torn last JSON line of a log is trimmed (logged); a bad line anywhere else is an error naming the
    file and line. A final/ that does not verify is removed and rebuilt. A resume checkpoint already at max_steps
    only writes final/ (no extra optimiser step).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import time
import zipfile
from pathlib import Path

import yaml
from transformers import TrainerCallback

from stapo.atomic import atomic_write, atomic_write_json
from stapo.diagnostics import TokenDiagnostics
from stapo.errors import UserError

__all__ = ["COMPLETE", "FINAL_COMPLETE", "RunDirError", "RunConfigMismatch", "CheckpointSentinel", "checkpoints",
           "problems", "latest_complete_checkpoint", "prepare_resume", "trim_jsonl", "claim", "config_changes",
           "verify_final", "save_final", "finalize_from_checkpoint", "checkpoint_step", "LOGS"]

log = logging.getLogger("stapo.rundir")
COMPLETE = "STAPO_CHECKPOINT_COMPLETE"  # checkpoint manifest, written after every rank has saved
FINAL_COMPLETE = "STAPO_FINAL_COMPLETE"  # final/ manifest, written into the temporary dir before the rename
CONFIG = "config.yaml"
LOGS = ("metrics.jsonl", *TokenDiagnostics.FILES)  # JSON lines with a "step" field
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
# checkpoint files that only resuming needs; final/ is the checkpoint without them
RESUME_ONLY = ("optimizer.pt", "scheduler.pt", "trainer_state.json", "scaler.pt", "latest", "zero_to_fp32.py", COMPLETE)
# train.* keys that change no weight: a rerun may change them
BOOKKEEPING = ("save_steps", "save_total_limit", "logging_steps", "diagnostics_every", "diagnostics_examples")
CONSTANT_LR = ("constant", "constant_with_warmup")


def process_state():
    """accelerate's process state, on the CPU when there is no GPU. The first PartialState of a process fixes the
    distributed type, and only ``cpu=True`` makes a CPU launch of several processes one gloo group (MULTI_CPU):
    every caller in stapo goes through here."""
    import torch
    from accelerate import PartialState

    return PartialState(cpu=not torch.cuda.is_available())


class RunDirError(UserError):
    """A run directory that cannot be used as it is; the message names the directory/file."""


class RunConfigMismatch(RunDirError):
    """A rerun's config differs from the one the run directory was started with."""


# -------------------------------------------------------------------------------------------- integrity


def _manifest(directory: Path, sentinel: str) -> dict[str, int]:
    """relative path -> size of every file under ``directory`` (the sentinel itself excluded)."""
    return {str(p.relative_to(directory)): p.stat().st_size for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name != sentinel}


def _write_manifest(directory: Path, sentinel: str, step: int) -> None:
    atomic_write_json(directory / sentinel, {"step": step, "files": _manifest(directory, sentinel)})


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


def problems(directory: str | os.PathLike, sentinel: str = COMPLETE) -> list[str]:
    """What makes a checkpoint (or final/) directory not intact; [] when intact.

    Intact: the sentinel manifest exists and parses, every file it lists has its recorded size, weights are
    present, and no safetensors / torch.save / JSON file is structurally cut. (A sentinel of the old format, the
    bare step number, has no sizes: only the structural checks apply.)
    """
    directory = Path(directory)
    mark, found, files = directory / sentinel, [], {}
    if not mark.is_file():
        found.append(f"no {sentinel} (the save did not finish)")
    else:
        try:
            files = json.loads(mark.read_text(encoding="utf-8")).get("files", {})
        except (ValueError, AttributeError):
            pass  # old format: "<step>\n"
    for name, size in files.items():
        path = directory / name
        if not path.is_file():
            found.append(f"{name} missing")
        elif path.stat().st_size != size:
            found.append(f"{name} has {path.stat().st_size} bytes, {size} were written")
    if not any((directory / w).is_file() for w in WEIGHTS):
        found.append("no weights file")
    for path in sorted(directory.rglob("*")):
        why = _cut(path) if path.is_file() and path.name != sentinel else None
        if why:
            found.append(f"{path.relative_to(directory)} {why}")
    if sentinel == COMPLETE and not (directory / "trainer_state.json").is_file():
        found.append("no trainer_state.json")
    return sorted(set(found))


def checkpoints(out: str | os.PathLike) -> list[tuple[int, Path]]:
    """(step, path) of every ``checkpoint-<N>`` directory, oldest first."""
    found = []
    for path in Path(out).glob("checkpoint-*"):
        suffix = path.name[len("checkpoint-"):]
        if path.is_dir() and suffix.isdigit():
            found.append((int(suffix), path))
    return sorted(found)


def checkpoint_step(ckpt: Path) -> int:
    return int(Path(ckpt).name.split("-")[1])


def latest_complete_checkpoint(out: str | os.PathLike) -> Path | None:
    """The newest intact checkpoint-<N> (see :func:`problems`); damaged or half-written ones are skipped."""
    for _, path in reversed(checkpoints(out)):
        if not problems(path):
            return path
    return None


class CheckpointSentinel(TrainerCallback):
    """Write ``checkpoint-<step>/STAPO_CHECKPOINT_COMPLETE`` once every rank has finished saving it."""

    def on_save(self, args, state, control, **kwargs):
        process_state().wait_for_everyone()  # ZeRO shards and per-rank RNG files are written by every rank
        if state.is_world_process_zero:
            ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if ckpt.is_dir():
                _write_manifest(ckpt, COMPLETE, state.global_step)


# ------------------------------------------------------------------------------------------------ resume


def trim_jsonl(path: Path, step: int) -> None:
    """Keep the lines of a JSON-lines log with ``"step" <= step``; a torn last line (a kill mid-write) is dropped.

    Raises RunDirError naming file:line for an unparseable line that is not the last one (not a kill artefact).
    """
    if not path.exists():
        return
    text = path.read_text(encoding="utf-8", errors="replace")
    lines, kept, dropped = text.splitlines(), [], 0
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            if i < len(lines):
                raise RunDirError(f"{path}:{i}: not a JSON line ({line[:60]!r}); fix or delete the line") from None
            log.warning("%s:%d: discarding a torn last line (%d chars: %r)", path, i, len(line), line[:80])
            continue
        if row.get("step", 0) <= step:
            kept.append(line)
        else:
            dropped += 1
    if dropped:
        log.warning("%s: discarding %d line(s) past step %d (the resume checkpoint)", path, dropped, step)
    new = "".join(line + "\n" for line in kept)
    if new != text:
        atomic_write(path, new)


def _clean_after(out: Path, step: int) -> None:
    """Remove checkpoints newer than ``step`` or not intact, and log lines past ``step``."""
    for n, path in checkpoints(out):
        found = problems(path)
        if n > step or found:
            log.warning("removing checkpoint %s: %s", path, "; ".join(found) or f"newer than step {step}")
            shutil.rmtree(path, ignore_errors=True)
    for name in LOGS:
        trim_jsonl(out / name, step)


def prepare_resume(out: str | os.PathLike) -> Path | None:
    """The checkpoint to resume from (None: start at step 0), after removing what lies past it.

    Every rank picks the same checkpoint; only the main process deletes and rewrites (then all ranks wait).
    """
    out, state = Path(out), process_state()
    ckpt = latest_complete_checkpoint(out)
    if state.is_main_process:
        _clean_after(out, checkpoint_step(ckpt) if ckpt else 0)
    state.wait_for_everyone()
    return ckpt


# ------------------------------------------------------------------------------------- the run's config


def _flat(d: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in d.items():
        if isinstance(value, dict) and value:
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def config_changes(started: dict, now: dict, *, last_step: int = 0) -> list[str]:
    """The differences between a run's starting config and a rerun's that would change the trained weights.

    ``train.<bookkeeping>`` keys (checkpointing, logging, diagnostics) may change. ``train.max_steps`` may change
    under a constant LR schedule (the schedule does not depend on it) when no checkpoint lies past the new value.
    """
    a, b = _flat(started), _flat(now)
    # train.* counts rollout steps, trl.* (and last_step, a checkpoint number) optimiser steps: compare like units
    bookkeeping = {f"train.{k}" for k in BOOKKEEPING} | {"trl.save_steps"}
    new_max = b.get("trl.max_steps", b.get("train.max_steps"))
    changes = []
    for key in sorted(set(a) | set(b)):
        if a.get(key) == b.get(key) or key in bookkeeping:
            continue
        if (key in ("train.max_steps", "trl.max_steps") and b.get("train.lr_scheduler_type") in CONSTANT_LR
                and isinstance(new_max, int) and new_max >= last_step):
            continue
        changes.append(f"{key}: {a.get(key, '<absent>')!r} (run) -> {b.get(key, '<absent>')!r} (now)")
    return changes


def _supersede(out: Path) -> Path:
    """Move everything of the old run into ``out/superseded-<UTC time>/`` (kept for the user to inspect/delete)."""
    dest = out / time.strftime("superseded-%Y%m%dT%H%M%SZ", time.gmtime())
    dest.mkdir()
    for path in list(out.iterdir()):
        if path != dest and not path.name.startswith("superseded-"):
            os.replace(path, dest / path.name)
    log.warning("--restart: moved the previous run to %s", dest)
    return dest


def claim(out: str | os.PathLike, resolved: dict, *, restart: bool = False) -> None:
    """Record the run's starting config in DIR/config.yaml, or check a rerun's ``resolved`` config against it.

    Raises RunConfigMismatch (before any model loads) when DIR holds a checkpoint or final/ of a run started with a
    config that differs in anything that changes the weights (:func:`config_changes`), unless ``restart``.
    Only the main process writes.
    """
    out, state = Path(out), process_state()
    path = out / CONFIG
    now = yaml.safe_load(yaml.safe_dump(resolved, sort_keys=False))  # compare as stored (tuples -> lists ...)
    ckpts = [p for _, p in checkpoints(out)]
    has_progress = bool(ckpts) or (out / "final").exists()
    if path.is_file() and has_progress:
        started = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        last = checkpoint_step(ckpts[-1]) if ckpts else 0
        changes = config_changes(started, now, last_step=last)
        if changes and not restart:
            shown = "; ".join(changes[:4]) + (f"; ... ({len(changes)} in all)" if len(changes) > 4 else "")
            raise RunConfigMismatch(f"{path}: this run was started with another config ({shown}). Resuming would "
                                    "mix the two; rerun with --restart (Snakemake: STAPO_RESTART=1 snakemake ...) to "
                                    "move the old run aside and start afresh, or give another --out")
        if changes and state.is_main_process:
            _supersede(out)
    elif has_progress:
        log.warning("%s: no %s (run started by an older stapo); recording the current config", out, CONFIG)
    if state.is_main_process:
        atomic_write(path, yaml.safe_dump(now, sort_keys=False))
    state.wait_for_everyone()


# ------------------------------------------------------------------------------------------------- final


def verify_final(out: str | os.PathLike, max_steps: int | None = None) -> bool:
    """Whether DIR/final is a complete final model (of ``max_steps``, when given); a damaged one is removed.

    A final/ without a manifest (written by an older stapo) passes on the structural checks alone.
    """
    final, state = Path(out) / "final", process_state()
    if not final.is_dir():
        return False
    if (final / FINAL_COMPLETE).is_file():
        found = problems(final, FINAL_COMPLETE)
        step = None if found else json.loads((final / FINAL_COMPLETE).read_text(encoding="utf-8")).get("step")
        if not found and max_steps is not None and step != max_steps:
            found = [f"written at step {step}, the config trains to {max_steps}"]
    else:
        found = [p for p in problems(final, FINAL_COMPLETE) if not p.startswith("no " + FINAL_COMPLETE)]
        if not found:
            log.warning("%s has no %s (an older stapo wrote it); its files are whole", final, FINAL_COMPLETE)
    if found:
        log.warning("%s is not a complete final model (%s): rebuilding it", final, "; ".join(found))
        if state.is_main_process:
            shutil.rmtree(final, ignore_errors=True)
        state.wait_for_everyone()
        return False
    return True


def _publish_final(tmp: Path, out: Path, step: int) -> Path:
    """Manifest into the temporary dir, then one rename onto DIR/final."""
    final = out / "final"
    _write_manifest(tmp, FINAL_COMPLETE, step)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def save_final(trainer, out: str | os.PathLike) -> Path:
    """Write DIR/final (weights + tokenizer) from a trained ``trainer`` through a temporary sibling, on every
    rank's watch (ZeRO-3 gathers the weights collectively)."""
    out = Path(out)
    tmp = out / ".final.tmp"
    acc = trainer.accelerator
    if acc.is_main_process and tmp.exists():
        shutil.rmtree(tmp)
    acc.wait_for_everyone()
    trainer.save_model(str(tmp))
    acc.wait_for_everyone()
    if acc.is_main_process:
        trainer.processing_class.save_pretrained(str(tmp))
        _publish_final(tmp, out, trainer.state.global_step)
    acc.wait_for_everyone()
    return out / "final"


def finalize_from_checkpoint(ckpt: str | os.PathLike, out: str | os.PathLike) -> Path:
    """DIR/final from an intact checkpoint at max_steps (a kill after its save, before final/): its weights,
    config and tokenizer, without the optimizer/scheduler/RNG state. No training step is taken."""
    ckpt, out, state = Path(ckpt), Path(out), process_state()
    if state.is_main_process:
        tmp = out / ".final.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for path in ckpt.iterdir():
            if path.is_file() and path.name not in RESUME_ONLY and not path.name.startswith("rng_state"):
                shutil.copy2(path, tmp / path.name)
        log.info("%s is at max_steps: writing final/ from it (no further step)", ckpt)
        _publish_final(tmp, out, checkpoint_step(ckpt))
    state.wait_for_everyone()
    return out / "final"
