"""The run directory of one ``stapo train`` run: what a complete one holds, what a rerun resumes from, and when
the run is done. No model is loaded here; the trainer calls these around ``trainer.train()``.

Layout of DIR (``runs/<model>/<method>``):
    config.yaml         the resolved config the run was STARTED with (model, method, train, trl). A rerun whose
                        config differs in anything that changes the weights refuses (:class:`RunConfigMismatch`)
                        rather than resume one config's optimiser state under another; ``--restart`` moves the
                        old run aside (``superseded-<UTC time>/``) and starts afresh.
    metrics.jsonl       one JSON line per optimiser step (+ the token diagnostics' files), appended and fsynced.
    stapo.lock          the one-writer lock (stapo.core.lock): a second run into DIR refuses at once, naming the
                        holder's PID and host; the kernel drops it when the holder dies (kill -9 included).
    checkpoint-<N>/     resume state: HF Trainer checkpoints (weights, optimiser, scheduler, RNG, data position).
                        ``STAPO_CHECKPOINT_COMPLETE`` is written last, once every rank has saved: a JSON manifest
                        {step, files: {path: bytes}, sha256: {path: digest}} (stapo.core.manifest). Only the newest
                        ``train.save_total_limit`` (default 1) are kept, the older ones deleted once the new one is
                        complete (never before: a kill during a save leaves the previous one). Saved every
                        ``train.save_steps`` rollout steps and when the job is asked to leave
                        (stapo.train.continuation).
    snapshot-<N>/       evaluation snapshot: the weights only, in the dtype the evaluation loads (bf16 when the run
                        trains in bf16, else fp32), safetensors, config and tokenizer, at the rollout steps of
                        ``train.snapshot_steps`` (the workflow's eval_every curve and named checkpoints), with its
                        manifest ``STAPO_SNAPSHOT_COMPLETE``. The workflow deletes each once its evaluations are scored
                        (workflow.keep_snapshots: false).
    final/              weights + tokenizer, written through a temporary sibling and one rename, with its own
                        manifest ``STAPO_FINAL_COMPLETE``. The run is done iff final/ verifies.

What a kill (or a full disk) can leave, and what a rerun does with it:
    a checkpoint without its manifest, with a file whose size or SHA-256 is not the manifest's (a bit flip after
    the save included: the resume checkpoint is read in full), or with a file that is structurally cut
    (safetensors header offsets past the end, a torch.save zip without its central directory, JSON that does not
    parse) is not "intact": the rerun resumes from the newest intact one and removes the others
    (logged). A torn last JSON line of a log is trimmed (logged); a bad line anywhere else is an error naming the
    file and line. A final/ that does not verify is removed and rebuilt. A resume checkpoint already at max_steps
    only writes final/ (no extra optimiser step).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import time
from pathlib import Path

import yaml
from transformers import TrainerCallback

from stapo.core import bounded, limits, manifest
from stapo.core.atomic import atomic_write, guard
from stapo.train.diagnostics import TokenDiagnostics
from stapo.core.errors import UserError
from stapo.core.jsonl import JsonlError, jsonl_records
from stapo.core.leave import CONTINUE_MARK, EXIT_CONTINUE, Continuation
from stapo.core.lock import RUN_LOCK, hold
from stapo.core.manifest import COMPLETE, FINAL_COMPLETE, SNAPSHOT_COMPLETE
from stapo.tasks.problems import TrainPrompt

__all__ = ["COMPLETE", "FINAL_COMPLETE", "RunDirError", "run_lock", "final_problems", "RunConfigMismatch",
           "CheckpointSentinel", "checkpoints", "problems", "latest_complete_checkpoint", "prepare_resume",
           "trim_jsonl", "claim", "config_changes", "verify_final", "save_final", "finalize_from_checkpoint",
           "checkpoint_step", "LOGS", "Snapshots", "snapshots"]

log = logging.getLogger("stapo.train.rundir")
CONFIG = "config.yaml"
LOGS = ("metrics.jsonl", *TokenDiagnostics.FILES)  # JSON lines with a "step" field
# checkpoint files that only resuming needs; final/ is the checkpoint without them
# (FSDP with FULL_STATE_DICT: optimizer.bin and pytorch_model_fsdp.bin, the full fp32 optimizer state and weights)
RESUME_ONLY = ("optimizer.pt", "scheduler.pt", "trainer_state.json", "scaler.pt", "latest", "zero_to_fp32.py",
               "optimizer.bin", "pytorch_model_fsdp.bin", COMPLETE)
# keys a run's recorded config may lack (recorded since a later version): absent counts as this value (None: as
# whatever the rerun records: the engine and normaliser were not recorded, and follow from the launch)
LATER_KEYS = {"train.prompt": TrainPrompt.STRIPPED.value, "train.report_to": "none", "trl.engine": None,
              "trl.normaliser": None}
# train.* keys that change no weight: a rerun may change them
BOOKKEEPING = ("save_steps", "save_total_limit", "snapshot_steps", "logging_steps", "diagnostics_every",
               "diagnostics_examples", "report_to")
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


def _write_manifest(directory: Path, sentinel: str, step: int) -> None:
    manifest.write_manifest(directory, sentinel, step)


def problems(directory: str | os.PathLike, sentinel: str = COMPLETE, *, content: bool = True) -> list[str]:
    """What makes a checkpoint (or final/) directory not intact; [] when intact (stapo.core.manifest.verify: sizes,
    SHA-256 when ``content``, file structure; a checkpoint also needs its trainer_state.json)."""
    found = manifest.problems(directory, sentinel, content=content)
    if sentinel == COMPLETE and not (Path(directory) / "trainer_state.json").is_file():
        found.append("no trainer_state.json")
    return sorted(set(found))


def _on_main(compute):
    """``compute()`` on the main process only (it reads whole checkpoints), its result sent to every rank."""
    state = process_state()
    result = [compute() if state.is_main_process else None]
    if state.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        broadcast_object_list(result, from_process=0)
    return result[0]


def _numbered(out: str | os.PathLike, prefix: str) -> list[tuple[int, Path]]:
    """(step, path) of every ``<prefix><N>`` directory in ``out``, oldest first."""
    found = []
    for path in Path(out).glob(f"{prefix}*"):
        suffix = path.name[len(prefix):]
        if path.is_dir() and suffix.isdigit():
            found.append((int(suffix), path))
    return sorted(found)


def checkpoints(out: str | os.PathLike) -> list[tuple[int, Path]]:
    """(step, path) of every ``checkpoint-<N>`` directory, oldest first."""
    return _numbered(out, "checkpoint-")


def checkpoint_step(ckpt: Path) -> int:
    return int(Path(ckpt).name.split("-")[1])


def latest_complete_checkpoint(out: str | os.PathLike) -> Path | None:
    """The newest intact checkpoint-<N> (see :func:`problems`, content included); damaged or half-written ones are
    skipped. Only as many checkpoints are read in full as it takes to find an intact one."""
    return _resume_point(Path(out))[0]


def _resume_point(out: Path) -> tuple[Path | None, dict[Path, list[str]]]:
    """(the newest intact checkpoint, what is wrong with each newer one)."""
    damaged = {}
    for _, path in reversed(checkpoints(out)):
        found = problems(path)
        if not found:
            return path, damaged
        damaged[path] = found
    return None, damaged


class CheckpointSentinel(TrainerCallback):
    """Write ``checkpoint-<step>/STAPO_CHECKPOINT_COMPLETE`` once every rank has finished saving it, then delete the
    resume checkpoints older than the newest ``keep`` complete ones (None: keep all). HF's own rotation
    (save_total_limit) is off: it deletes the previous checkpoint before the new one is complete."""

    def __init__(self, keep: int | None = None):
        self.keep = keep

    def on_save(self, args, state, control, **kwargs):
        process_state().wait_for_everyone()  # ZeRO shards and per-rank RNG files are written by every rank
        if state.is_world_process_zero:
            out = Path(args.output_dir)
            ckpt = out / f"checkpoint-{state.global_step}"
            if ckpt.is_dir():
                _write_manifest(ckpt, COMPLETE, state.global_step)
                if self.keep is not None:
                    rotate_checkpoints(out, self.keep)
        process_state().wait_for_everyone()


def rotate_checkpoints(out: Path, keep: int) -> list[Path]:
    """Delete every ``checkpoint-<N>`` older than the newest ``keep`` that carry their manifest; returns them."""
    complete = [path for _, path in checkpoints(out) if (path / COMPLETE).is_file()]
    if len(complete) <= keep:
        return []
    newest_kept = complete[-keep]
    gone = [path for n, path in checkpoints(out) if n < checkpoint_step(newest_kept)]
    for path in gone:
        shutil.rmtree(path, ignore_errors=True)
    return gone


def snapshots(out: str | os.PathLike) -> list[tuple[int, Path]]:
    """(step, path) of every ``snapshot-<N>`` directory, oldest first."""
    return _numbered(out, "snapshot-")


class Snapshots(TrainerCallback):
    """Write ``snapshot-<N>/`` (module docstring) after the optimiser steps N = k × each of ``settings.snapshot_steps``;
    ``trainer`` is set once built. Every rank enters (FSDP/ZeRO gather the full state dict); rank 0 writes, through a
    temporary sibling and one rename."""

    def __init__(self, settings, k: int):
        import torch

        self.steps = {n * k for n in settings.snapshot_steps}
        self.dtype = torch.bfloat16 if settings.bf16 else torch.float32
        self.trainer = None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in self.steps:
            write_snapshot(self.trainer, Path(args.output_dir), state.global_step, self.dtype)


def write_snapshot(trainer, out: Path, step: int, dtype) -> Path:
    """``out/snapshot-<step>``: the trainer's model in ``dtype`` (safetensors), its config (dtype recorded) and
    tokenizer, and the manifest."""
    acc = trainer.accelerator
    state_dict = acc.get_state_dict(trainer.model)  # a collective under FSDP / ZeRO-3: every rank calls it
    dest = out / f"snapshot-{step}"
    if acc.is_main_process:
        tmp = out / f".snapshot-{step}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        cast = {key: value.detach().to(dtype).contiguous() for key, value in state_dict.items()}
        model = acc.unwrap_model(trainer.model)
        model.save_pretrained(str(tmp), state_dict=cast, safe_serialization=True)
        config = json.loads((tmp / "config.json").read_text(encoding="utf-8"))
        for key in ("dtype", "torch_dtype"):  # what the evaluation's dtype="auto" loads
            if key in config:
                config[key] = str(dtype).removeprefix("torch.")
        atomic_write(tmp / "config.json", json.dumps(config, indent=2, sort_keys=True) + "\n")
        trainer.processing_class.save_pretrained(str(tmp))
        _write_manifest(tmp, SNAPSHOT_COMPLETE, step)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    acc.wait_for_everyone()
    return dest


# ------------------------------------------------------------------------------------------------ resume


def trim_jsonl(path: Path, step: int) -> None:
    """Keep the lines of a JSON-lines log with ``"step" <= step``; a torn last line (a kill mid-write) is dropped,
    with a warning (stapo.core.jsonl's policy for a log written line by line).

    Raises RunDirError naming file:line for any other line that is not a JSON object (not a kill artefact).
    """
    if not path.exists():
        return
    data = bounded.read_bytes(path, limits.MAX_LOG_BYTES, "a training log")
    try:
        records = jsonl_records(path, appended=True, data=data)
    except JsonlError as err:
        raise RunDirError(f"{err.where}: not a JSON line ({err.text[:60]!r}); fix or delete the line") from None
    kept = [r.text for r in records if r.row.get("step", 0) <= step]
    if len(kept) < len(records):
        log.warning("%s: discarding %d line(s) past step %d (the resume checkpoint)", path, len(records) - len(kept),
                    step)
    new = "".join(line + "\n" for line in kept)
    if new.encode("utf-8") != data:
        atomic_write(path, new, inside=path.parent)


def _clean_after(out: Path, resume: Path | None, damaged: dict[Path, list[str]]) -> None:
    """Remove checkpoints newer than ``resume`` (damaged, or past a damaged one) and older ones that fail the cheap
    checks (sizes, structure: they are never resumed from, so their content is not read), and log lines past it."""
    step = checkpoint_step(resume) if resume else 0
    for n, path in checkpoints(out):
        if path == resume:
            continue
        found = damaged.get(path) or (problems(path, content=False) if n < step else [])
        if n > step or found:
            log.warning("removing checkpoint %s: %s", path, "; ".join(found) or f"newer than step {step}")
            shutil.rmtree(path, ignore_errors=True)
    for n, path in snapshots(out):  # written after the resume point: the resumed run writes them again
        if n > step:
            log.warning("removing snapshot %s: newer than step %d", path, step)
            shutil.rmtree(path, ignore_errors=True)
    for name in LOGS:
        trim_jsonl(out / name, step)


def prepare_resume(out: str | os.PathLike) -> Path | None:
    """The checkpoint to resume from (None: start at step 0), after removing what lies past it.

    The main process verifies (reading the candidates in full), deletes and rewrites; every rank gets its choice.
    """
    out, state = Path(out), process_state()

    def choose():
        ckpt, damaged = _resume_point(out)
        _clean_after(out, ckpt, damaged)
        return None if ckpt is None else str(ckpt)

    ckpt = _on_main(choose)
    state.wait_for_everyone()
    return None if ckpt is None else Path(ckpt)


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
        if key in bookkeeping or a.get(key) == b.get(key):
            continue
        if key not in a and key in LATER_KEYS and LATER_KEYS[key] in (None, b.get(key)):
            continue
        if (key in ("train.max_steps", "trl.max_steps") and b.get("train.lr_scheduler_type") in CONSTANT_LR
                and isinstance(new_max, int) and new_max >= last_step):
            continue
        changes.append(f"{key}: {a.get(key, '<absent>')!r} (run) -> {b.get(key, '<absent>')!r} (now)")
    return changes


def is_run_entry(name: str) -> bool:
    """Whether ``name`` in a run directory is something a run writes (config, logs, checkpoints, final, TensorBoard
    events); --restart moves only these, so a run directory pointed at the wrong place moves nobody else's files."""
    return (name in (CONFIG, *LOGS, "final", ".final.tmp", "runs", CONTINUE_MARK)
            or name.startswith(("checkpoint-", "final.", "snapshot-", ".snapshot-")))


def _supersede(out: Path) -> Path:
    """Move the old run's own entries (:func:`is_run_entry`) into ``out/superseded-<UTC time>/`` (kept for the
    user to inspect/delete); the lock stays (this process holds it), and so does anything the run did not write."""
    dest = out / time.strftime("superseded-%Y%m%dT%H%M%SZ", time.gmtime())
    dest.mkdir()
    foreign = []
    for path in list(out.iterdir()):
        if is_run_entry(path.name):
            os.replace(path, dest / path.name)
        elif path != dest and not path.name.startswith("superseded-") and path.name != RUN_LOCK:
            foreign.append(path.name)
    log.warning("--restart: moved the previous run to %s%s", dest,
                f"; left {len(foreign)} entries no run writes ({', '.join(sorted(foreign)[:5])})" if foreign else "")
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
        started = bounded.load_yaml(path, limits.MAX_JSON_BYTES, "a run's config.yaml") or {}
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
        atomic_write(path, yaml.safe_dump(now, sort_keys=False), inside=out)
    state.wait_for_everyone()


# ------------------------------------------------------------------------------------------------- final


def verify_final(out: str | os.PathLike, max_steps: int | None = None) -> bool:
    """Whether DIR/final is a complete final model (of ``max_steps``, when given); a damaged one is removed.

    A final/ without a manifest (written by an older stapo) passes on the structural checks alone.
    """
    final, state = Path(out) / "final", process_state()
    if not final.is_dir():
        return False
    found = _on_main(lambda: final_problems(final, max_steps))
    if found:
        log.warning("%s is not a complete final model (%s): rebuilding it", final, "; ".join(found))
        if state.is_main_process:
            shutil.rmtree(final, ignore_errors=True)
        state.wait_for_everyone()
        return False
    return True


def final_problems(final: Path, max_steps: int | None = None) -> list[str]:
    """What makes ``final`` not a complete final model (of ``max_steps``, when given); [] when it is."""
    if (final / FINAL_COMPLETE).is_file():
        found = problems(final, FINAL_COMPLETE)
        step = None if found else bounded.load_json(final / FINAL_COMPLETE, what="a manifest").get("step")
        if not found and max_steps is not None and step != max_steps:
            found = [f"written at step {step}, the config trains to {max_steps}"]
        return found
    found = [p for p in problems(final, FINAL_COMPLETE) if not p.startswith("no " + FINAL_COMPLETE)]
    if not found:
        log.warning("%s has no %s (an older stapo wrote it); its files are whole", final, FINAL_COMPLETE)
    return found


def run_lock(out: str | os.PathLike):
    """One writer per run directory: the main process holds ``out/stapo.lock`` (stapo.core.lock) while the block runs;
    a second run into ``out`` refuses at once naming the holder. Other ranks take nothing."""
    if process_state().is_main_process:
        return hold(Path(out) / RUN_LOCK, f"run directory {out}")
    return contextlib.nullcontext()


def _publish_final(tmp: Path, out: Path, step: int) -> Path:
    """Manifest into the temporary dir, then one rename onto DIR/final."""
    final = out / "final"
    _write_manifest(tmp, FINAL_COMPLETE, step)
    guard(final, inside=out)
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


def leave_to_continue(out: Path, step: int, signal_name: str, max_steps: int):
    """The job leaves with checkpoint-<step> complete: rank 0 writes DIR/stapo.continue (what the train rule reads to
    requeue the job: stapo.train.continuation), and every rank raises :class:`Continuation` (exit status 75)."""
    if process_state().is_main_process:
        atomic_write(out / CONTINUE_MARK, json.dumps({"step": step, "signal": signal_name}) + "\n", inside=out)
    process_state().wait_for_everyone()
    raise Continuation(f"{out}: left at step {step} of {max_steps} ({signal_name}): checkpoint-{step} saved; run the "
                       f"same command again to continue (exit status {EXIT_CONTINUE})")


# ------------------------------------------------------------------------- a run that cannot go on


class NonFiniteTraining(UserError):
    """The loss or the weights stopped being finite numbers: the run stops before it saves them."""


class FiniteWeights(TrainerCallback):
    """After every optimiser step, before anything is saved: the weights are finite, else the run stops in one line
    naming the step and the learning rate (a diverged run would otherwise train on, save NaN checkpoints and exit
    0). One pass of ``isfinite`` over the (local shard of the) parameters per step."""

    def __init__(self, settings):  # stapo.study.TrainSettings
        self.learning_rate = settings.learning_rate

    def on_step_end(self, args, state, control, model=None, **kwargs):
        bad = next((name for name, p in model.named_parameters() if not p.isfinite().all()), None)
        if bad is not None:
            last = latest_complete_checkpoint(args.output_dir)
            raise NonFiniteTraining(
                f"step {state.global_step}: parameter {bad} is no longer finite (NaN/inf) after the optimiser step; "
                f"nothing of this step was saved (train.learning_rate {self.learning_rate:g}: lower it); "
                + (f"the last intact checkpoint is {last}" if last else "no checkpoint was saved yet"))


def is_disk_full(err: BaseException) -> bool:
    """Whether ``err`` (or what caused it) is a write that ran out of space: ENOSPC/EDQUOT, or the way torch's and
    safetensors' writers report a short write (``unexpected pos 5952 vs 5844``, ``StorageFull``)."""
    while err is not None:
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(s in str(err) for s in ("No space left", "StorageFull", "unexpected pos", "Disk quota exceeded")):
            return True
        err = err.__cause__ or err.__context__
    return False


@contextlib.contextmanager
def disk_full_is_one_line(out: Path):
    """A full disk during a checkpoint or final save is one line naming the directory and its free space."""
    try:
        yield
    except Exception as err:  # OSError, torch's RuntimeError, safetensors' SafetensorError ...
        if not is_disk_full(err):
            raise
        free = shutil.disk_usage(out).free / 2**20
        last = latest_complete_checkpoint(out)
        raise UserError(f"disk full while writing {out} ({free:,.0f} MiB free there): free space or give another "
                        f"--out; a rerun resumes from {last or 'the start (no intact checkpoint)'}") from err
