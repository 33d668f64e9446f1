"""stapo.train.rundir on fabricated run directories (no model is loaded): the checkpoint manifest, falling back past
damaged checkpoints, torn log lines, final/ verification, finishing a run killed after its last checkpoint, and the
run's recorded config (a rerun with another one refuses). One slow end-to-end test kills a real run."""

from __future__ import annotations

import json
import logging
import os
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml


from safetensors.torch import load_file, save_file

import stapo.train.trainer as T
from stapo.train import trl_config
from stapo import cli, study
from stapo.train import rundir
from stapo.tasks.rewards import REWARDS

ROOT = Path(__file__).resolve().parents[1]


def fake_checkpoint(out: Path, step: int, *, manifest: bool = True, legacy_sentinel: bool = False) -> Path:
    """A checkpoint-<step>/ with the files an HF Trainer writes (real safetensors / torch.save formats)."""
    ckpt = out / f"checkpoint-{step}"
    ckpt.mkdir(parents=True)
    save_file({"w": torch.full((64, 64), float(step))}, str(ckpt / "model.safetensors"))
    torch.save({"state": torch.arange(4096.0) * step}, ckpt / "optimizer.pt")
    torch.save({"last_epoch": step}, ckpt / "scheduler.pt")
    torch.save({"python": step}, ckpt / "rng_state.pth")
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (ckpt / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    (ckpt / "tokenizer.json").write_text(json.dumps({"model": {}}))
    if legacy_sentinel:
        (ckpt / rundir.COMPLETE).write_text(f"{step}\n")  # the sentinel before manifests existed
    elif manifest:
        rundir._write_manifest(ckpt, rundir.COMPLETE, step)
    return ckpt


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def write_metrics(out: Path, steps, tail: str = "") -> None:
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 0.1 * s}) + "\n" for s in steps) + tail)


def metric_steps(out: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]


def tiny_plan(**train):
    recipe = study.load(ROOT / "configs" / "tiny.yaml")
    recipe["train"].update(dataset={"name": "synthetic-arith", "n": 16, "difficulty": 1, "seed": 0}, max_steps=4,
                           save_steps=2, prompts_per_generation=2, num_generations=4, prompts_per_step=2,
                           per_device_train_batch_size=4, max_completion_length=8)
    recipe["train"].update(train)
    return study.resolve_plan(recipe, "tiny-qwen3", "stapo")


@pytest.fixture
def no_training(monkeypatch):
    """T.train must not load a model or take a step in these tests."""

    def refuse(*args, **kwargs):
        raise AssertionError("build_trainer called: the run would train")

    monkeypatch.setattr(T, "build_trainer", refuse)


def started(out: Path, plan) -> None:
    """Record ``plan`` as the run's starting config, as the first `stapo train` does."""
    rundir.claim(out, trl_config.resolved_config(plan, trl_config.grpo_config(plan, out)))


# ----------------------------------------------------------------------------------- checkpoints (point 4)


@pytest.mark.parametrize("victim", ["model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json"])
def test_truncated_file_in_latest_checkpoint_falls_back_to_the_intact_one(tmp_path, caplog, victim):
    good = fake_checkpoint(tmp_path, 2)
    bad = fake_checkpoint(tmp_path, 4)
    truncate(bad / victim)
    write_metrics(tmp_path, [1, 2, 3, 4])
    assert rundir.problems(good) == []
    assert any(victim in p for p in rundir.problems(bad))
    with caplog.at_level(logging.WARNING, logger="stapo.train.rundir"):
        assert rundir.prepare_resume(tmp_path) == good
    assert not bad.exists() and metric_steps(tmp_path) == [1, 2]
    assert victim in caplog.text and "checkpoint-4" in caplog.text  # what was discarded, and why


def test_truncation_is_found_without_a_manifest(tmp_path):
    """Checkpoints of an older stapo (sentinel = the step number): the file formats themselves show a cut."""
    good = fake_checkpoint(tmp_path, 2, legacy_sentinel=True)
    bad = fake_checkpoint(tmp_path, 4, legacy_sentinel=True)
    truncate(bad / "model.safetensors", 0.9)
    assert rundir.problems(good) == []
    assert rundir.latest_complete_checkpoint(tmp_path) == good
    truncate(good / "optimizer.pt", 0.9)  # a torch.save zip without its central directory
    assert rundir.latest_complete_checkpoint(tmp_path) is None


def test_checkpoint_without_manifest_or_weights_is_never_picked(tmp_path):
    good = fake_checkpoint(tmp_path, 2)
    fake_checkpoint(tmp_path, 4, manifest=False)  # killed before the manifest
    no_weights = fake_checkpoint(tmp_path, 6)
    (no_weights / "model.safetensors").unlink()
    assert rundir.latest_complete_checkpoint(tmp_path) == good


def test_sentinel_callback_writes_a_size_manifest(tmp_path):
    ckpt = fake_checkpoint(tmp_path, 3, manifest=False)
    rundir.CheckpointSentinel().on_save(SimpleNamespace(output_dir=str(tmp_path)),
                                        SimpleNamespace(global_step=3, is_world_process_zero=True), None)
    manifest = json.loads((ckpt / rundir.COMPLETE).read_text())
    assert manifest["step"] == 3
    assert manifest["files"]["optimizer.pt"] == (ckpt / "optimizer.pt").stat().st_size > 0
    assert set(manifest["files"]) == {p.name for p in ckpt.iterdir()} - {rundir.COMPLETE}
    with (ckpt / "optimizer.pt").open("ab") as f:  # same format, wrong size: not what was written
        f.write(b"\0")
    assert rundir.problems(ckpt) == [f"optimizer.pt has {manifest['files']['optimizer.pt'] + 1} bytes, "
                                     f"{manifest['files']['optimizer.pt']} were written"]


def flip_a_bit_keeping_size_and_mtime(path: Path, offset_from_end: int = 5) -> None:
    """Damage after the save that sizes and mtimes cannot see: one bit of the data, same size, old mtime."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def test_manifest_records_the_sha256_of_every_file(tmp_path):
    import hashlib

    ckpt = fake_checkpoint(tmp_path, 2)
    manifest = json.loads((ckpt / rundir.COMPLETE).read_text())
    assert set(manifest["sha256"]) == set(manifest["files"])
    for name, digest in manifest["sha256"].items():
        assert digest == hashlib.sha256((ckpt / name).read_bytes()).hexdigest()


@pytest.mark.parametrize("victim", ["model.safetensors", "optimizer.pt"])
def test_same_size_bit_flip_is_found_on_resume(tmp_path, caplog, victim):
    good = fake_checkpoint(tmp_path, 2)
    bad = fake_checkpoint(tmp_path, 4)
    flip_a_bit_keeping_size_and_mtime(bad / victim, offset_from_end=200 if victim == "optimizer.pt" else 5)
    assert rundir.problems(bad, content=False) == []  # sizes and structure cannot see it
    assert rundir.problems(bad) == [f"{victim} content differs from its SHA-256 at save time (damaged after it "
                                    "was written)"]
    with caplog.at_level(logging.WARNING, logger="stapo.train.rundir"):
        assert rundir.prepare_resume(tmp_path) == good
    assert not bad.exists() and f"checkpoint-4: {victim} content differs" in caplog.text


def test_a_damaged_final_is_rebuilt(tmp_path, no_training):
    plan = tiny_plan(max_steps=4)
    started(tmp_path, plan)
    fake_checkpoint(tmp_path, 4)
    T.train(plan, tmp_path)
    flip_a_bit_keeping_size_and_mtime(tmp_path / "final" / "model.safetensors")
    assert rundir.final_problems(tmp_path / "final", 4) == [
        "model.safetensors content differs from its SHA-256 at save time (damaged after it was written)"]
    T.train(plan, tmp_path)  # not done: final/ is rebuilt from the intact checkpoint-4 (no step)
    assert rundir.verify_final(tmp_path, 4)


# ------------------------------------------------------------------------------------------ one writer (lock)

HOLDER = """
import sys, time
from stapo.core.lock import run_lock
with run_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(600)
"""


def test_one_writer_per_run_directory_and_no_stale_lock_after_kill_9(tmp_path):
    import signal
    import socket
    import subprocess
    import sys

    from stapo.core.lock import Busy, run_lock

    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(Busy) as err:
            with run_lock(tmp_path):
                raise AssertionError("a second writer got the lock")
        message = str(err.value)
        assert f"PID {proc.pid} on {socket.gethostname()}" in message and "\n" not in message
        assert str(tmp_path / "stapo.lock") in message
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with run_lock(tmp_path):  # the kernel released it with the process: nothing stale to clean up
        with run_lock(tmp_path):  # re-entrant in the holding process (CLI, then trainer)
            pass


def test_restart_keeps_the_lock_in_place(tmp_path, no_training):
    from stapo.core.lock import RUN_LOCK, run_lock

    started(tmp_path, tiny_plan(learning_rate=1e-5))
    fake_checkpoint(tmp_path, 2)
    with run_lock(tmp_path):
        inode = (tmp_path / RUN_LOCK).stat().st_ino
        with pytest.raises(AssertionError, match="build_trainer called"):
            T.train(tiny_plan(learning_rate=3e-5), tmp_path, restart=True)
        assert (tmp_path / RUN_LOCK).stat().st_ino == inode  # not moved into superseded-*/ while held
    assert not list(tmp_path.glob("superseded-*/" + RUN_LOCK))


# ------------------------------------------------------------------------------------------ logs (point 4)


def test_torn_last_metrics_line_is_trimmed_and_logged(tmp_path, caplog):
    ckpt = fake_checkpoint(tmp_path, 2)
    write_metrics(tmp_path, [1, 2], tail='{"step": 3, "lo')  # killed while appending step 3
    (tmp_path / "diagnostics.jsonl").write_text('{"step": 2}\n{"st')
    with caplog.at_level(logging.WARNING, logger="stapo.train.rundir"):
        assert rundir.prepare_resume(tmp_path) == ckpt
    assert metric_steps(tmp_path) == [1, 2]
    assert (tmp_path / "diagnostics.jsonl").read_text() == '{"step": 2}\n'
    assert "metrics.jsonl:3: discarding a torn last line" in caplog.text


def test_bad_line_inside_a_log_names_file_and_line(tmp_path):
    fake_checkpoint(tmp_path, 2)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nGARBAGE\n{"step": 2}\n')
    with pytest.raises(rundir.RunDirError, match=r"metrics\.jsonl:2: not a JSON line"):
        rundir.prepare_resume(tmp_path)


# ------------------------------------------------------------------------------------ final/ (points 3, 4)


def test_kill_after_last_checkpoint_only_writes_final(tmp_path, no_training):
    """checkpoint-4 at max_steps 4 is intact, final/ is missing: the rerun publishes it without a step."""
    plan = tiny_plan(max_steps=4)
    started(tmp_path, plan)
    fake_checkpoint(tmp_path, 2)
    ckpt = fake_checkpoint(tmp_path, 4)
    write_metrics(tmp_path, [1, 2, 3, 4])
    final = T.train(plan, tmp_path)  # build_trainer would raise: no model is loaded
    assert final == tmp_path / "final" and rundir.verify_final(tmp_path, 4)
    assert torch.equal(load_file(str(final / "model.safetensors"))["w"], torch.full((64, 64), 4.0))
    assert not (final / "optimizer.pt").exists() and not (final / "rng_state.pth").exists()
    assert (final / "config.json").exists() and (final / "tokenizer.json").exists()
    assert metric_steps(tmp_path) == [1, 2, 3, 4] and ckpt.exists()
    assert json.loads((final / rundir.FINAL_COMPLETE).read_text())["step"] == 4


def test_truncated_final_is_not_a_finished_run(tmp_path, no_training):
    plan = tiny_plan(max_steps=4)
    started(tmp_path, plan)
    fake_checkpoint(tmp_path, 4)
    T.train(plan, tmp_path)
    assert rundir.verify_final(tmp_path, 4)
    truncate(tmp_path / "final" / "model.safetensors")
    assert not rundir.verify_final(tmp_path, 4) and not (tmp_path / "final").exists()
    truncate(tmp_path / "checkpoint-4" / "model.safetensors")  # nothing intact left: the rerun must train
    with pytest.raises(AssertionError, match="build_trainer called"):
        T.train(plan, tmp_path)


def test_final_of_an_older_stapo_passes_on_its_file_formats(tmp_path):
    final = tmp_path / "final"
    final.mkdir()
    save_file({"w": torch.zeros(8)}, str(final / "model.safetensors"))
    assert rundir.verify_final(tmp_path, 4)
    truncate(final / "model.safetensors", 0.95)
    assert not rundir.verify_final(tmp_path, 4)


# ------------------------------------------------------------------------------------ run config (point 2)


def test_rerun_with_another_config_refuses(tmp_path, no_training):
    plan = tiny_plan(learning_rate=1e-5)
    started(tmp_path, plan)
    fake_checkpoint(tmp_path, 2)
    other = tiny_plan(learning_rate=3e-5)
    with pytest.raises(rundir.RunConfigMismatch, match=r"train\.learning_rate: 1e-05 \(run\) -> 3e-05 \(now\)"):
        T.train(other, tmp_path)
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["train"]["learning_rate"] == 1e-5
    assert (tmp_path / "checkpoint-2").exists()


def test_restart_moves_the_old_run_aside(tmp_path, no_training):
    started(tmp_path, tiny_plan(learning_rate=1e-5))
    fake_checkpoint(tmp_path, 2)
    write_metrics(tmp_path, [1, 2])
    with pytest.raises(AssertionError, match="build_trainer called"):  # it starts afresh: a model would load
        T.train(tiny_plan(learning_rate=3e-5), tmp_path, restart=True)
    (old,) = tmp_path.glob("superseded-*")
    assert (old / "checkpoint-2").is_dir() and (old / "metrics.jsonl").exists()
    assert not list(tmp_path.glob("checkpoint-*")) and not (tmp_path / "metrics.jsonl").exists()
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["train"]["learning_rate"] == 3e-5


def test_restart_moves_only_what_a_run_writes(tmp_path, no_training):
    """A run directory pointed at a place with other files (a model key '..' once made it the package directory):
    --restart moves the run's own entries and leaves the rest where it is."""
    (tmp_path / "__init__.py").write_text("code\n")
    (tmp_path / "notes").mkdir()
    started(tmp_path, tiny_plan(learning_rate=1e-5))
    fake_checkpoint(tmp_path, 2)
    with pytest.raises(AssertionError, match="build_trainer called"):
        T.train(tiny_plan(learning_rate=3e-5), tmp_path, restart=True)
    (old,) = tmp_path.glob("superseded-*")
    assert sorted(p.name for p in old.iterdir()) == ["checkpoint-2", "config.yaml"]
    assert (tmp_path / "__init__.py").read_text() == "code\n" and (tmp_path / "notes").is_dir()


def test_which_changes_mix_two_configs():
    a = {"model": {"spec": "m"}, "train": {"learning_rate": 1e-6, "max_steps": 8, "save_steps": 4,
                                           "lr_scheduler_type": "constant_with_warmup"}}
    same_weights = {**a, "train": {**a["train"], "save_steps": 2, "diagnostics_every": 5}}
    assert rundir.config_changes(a, same_weights, last_step=4) == []
    longer = {**a, "train": {**a["train"], "max_steps": 12}}  # constant LR: extending the run is the same run
    assert rundir.config_changes(a, longer, last_step=8) == []
    shorter = {**a, "train": {**a["train"], "max_steps": 4}}  # a checkpoint lies past the new end
    assert rundir.config_changes(a, shorter, last_step=8) == ["train.max_steps: 8 (run) -> 4 (now)"]
    cosine = {**a, "train": {**a["train"], "max_steps": 12, "lr_scheduler_type": "cosine"}}
    assert len(rundir.config_changes(a, cosine, last_step=8)) == 2
    assert rundir.config_changes(a, {**a, "model": {"spec": "n"}}) == ["model.spec: 'm' (run) -> 'n' (now)"]
    # a run recorded before train.prompt existed trained on its default: resuming with the default is the same run
    assert rundir.config_changes(a, {**a, "train": {**a["train"], "prompt": "stripped"}}) == []
    assert rundir.config_changes(a, {**a, "train": {**a["train"], "prompt": "justrl_raw"}}) == [
        "train.prompt: '<absent>' (run) -> 'justrl_raw' (now)"]
    recorded = {**a, "trl": {"engine": "fsdp", "normaliser": "exact_rescale"}}
    assert rundir.config_changes(a, recorded) == []  # not recorded before: follows from the launch
    assert rundir.config_changes(recorded, {**a, "trl": {"engine": "deepspeed", "normaliser": "exact_rescale"}}) == [
        "trl.engine: 'fsdp' (run) -> 'deepspeed' (now)"]


def test_max_steps_changes_compare_optimiser_steps_with_the_checkpoints():
    """train.max_steps / save_steps count rollout steps, trl.* and checkpoint numbers optimiser steps (k = 4)."""
    def cfg(max_steps, save_steps):
        return {"train": {"max_steps": max_steps, "save_steps": save_steps,
                          "lr_scheduler_type": "constant_with_warmup"},
                "trl": {"max_steps": 4 * max_steps, "save_steps": 4 * save_steps, "optimizer_steps_per_rollout": 4}}

    started = cfg(10, 2)  # checkpoint-40 is rollout step 10
    assert rundir.config_changes(started, cfg(20, 5), last_step=40) == []  # longer run, other save interval
    assert rundir.config_changes(started, cfg(12, 2), last_step=40) == []  # 48 optimiser steps >= checkpoint-40
    assert rundir.config_changes(started, cfg(5, 2), last_step=40) == [  # checkpoint-40 lies past the new end
        "train.max_steps: 10 (run) -> 5 (now)", "trl.max_steps: 40 (run) -> 20 (now)"]


def test_cli_reports_a_mismatch_in_one_line(tmp_path, capsys, monkeypatch, no_training):
    recipe = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    recipe["train"].update(max_steps=4, learning_rate=2e-5)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    out = tmp_path / "run"
    started(out, study.resolve_plan(recipe | {"train": {**recipe["train"], "learning_rate": 1e-5}}, "tiny-qwen3",
                                "stapo"))
    fake_checkpoint(out, 2)
    rc = cli.main(["train", "--recipe", str(path), "--model", "tiny-qwen3", "--method", "stapo", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("stapo train: error: ") and "train.learning_rate" in err and "--restart" in err
    with pytest.raises(rundir.RunConfigMismatch):  # --debug: the traceback is available
        cli.main(["--debug", "train", "--recipe", str(path), "--model", "tiny-qwen3", "--method", "stapo",
                  "--out", str(out)])
    monkeypatch.setenv("STAPO_RESTART", "1")  # how a Snakemake run passes --restart to its jobs
    with pytest.raises(AssertionError, match="build_trainer called"):
        cli.main(["train", "--recipe", str(path), "--model", "tiny-qwen3", "--method", "stapo", "--out", str(out)])
    assert len(list(out.glob("superseded-*/checkpoint-2"))) == 1


# ------------------------------------------------------------------------------------------ end to end (slow)


def coin_reward(prompts=None, completions=None, **kwargs):
    return [1.0 if zlib.crc32(c.encode()) % 2 else -1.0 for c in completions]


@pytest.mark.slow
def test_kill_between_last_checkpoint_and_final_e2e(tmp_path, monkeypatch):
    """A real run on bundled:tiny-qwen3 killed after saving checkpoint-2 (= max_steps), before final/: the rerun
    takes no third step and its final/ holds exactly the weights of an uninterrupted run."""
    monkeypatch.setitem(REWARDS, "coin", coin_reward)
    plan = tiny_plan(max_steps=2, save_steps=1, reward="coin", learning_rate=1e-3, warmup_steps=0, diagnostics_every=0)
    straight = T.train(plan, tmp_path / "straight")
    out = tmp_path / "killed"

    def killed_save_final(trainer, out):
        raise KeyboardInterrupt  # stands in for SIGKILL between the last checkpoint and final/

    monkeypatch.setattr(rundir, "save_final", killed_save_final)
    with pytest.raises(KeyboardInterrupt):
        T.train(plan, out)
    monkeypatch.undo()
    monkeypatch.setitem(REWARDS, "coin", coin_reward)
    assert not (out / "final").exists() and metric_steps(out) == [1, 2]
    final = T.train(plan, out)
    assert metric_steps(out) == [1, 2]
    a, b = load_file(str(straight / "model.safetensors")), load_file(str(final / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_two_stapo_train_into_one_dir_one_refuses_and_kill_9_leaves_no_stale_lock(tmp_path):
    """The acceptance check: a second `stapo train` into a directory being trained refuses at once naming the
    holder; after kill -9 of the first (past its first checkpoint) a rerun proceeds, resumes and finishes."""
    import signal
    import subprocess
    import sys
    import time

    from stapo.core.lock import RUN_LOCK, holder

    recipe = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    recipe["workflow"]["models"] = ["tiny-qwen3"]
    recipe["train"].update(dataset={"name": "synthetic-arith", "n": 16, "difficulty": 1, "seed": 0}, max_steps=3,
                           save_steps=1, save_total_limit=None, prompts_per_generation=2, num_generations=4,
                           prompts_per_step=2, per_device_train_batch_size=4, max_completion_length=8,
                           diagnostics_every=0)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    out = tmp_path / "run"
    argv = [str(Path(sys.executable).parent / "stapo"), "train", "--recipe", str(path), "--model", "tiny-qwen3",
            "--method", "stapo", "--out", str(out)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while holder(out / RUN_LOCK).get("pid") != first.pid and time.monotonic() < deadline:
            time.sleep(0.05)
        start = time.monotonic()
        second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        refused_in = time.monotonic() - start
        deadline = time.monotonic() + 300
        while not (out / "checkpoint-1" / rundir.COMPLETE).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    print(f"second stapo train refused in {refused_in:.2f} s: {second.stderr.strip()}")
    assert second.returncode == 2 and f"is in use by PID {first.pid}" in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1 and refused_in < 5
    assert (out / "checkpoint-1" / rundir.COMPLETE).exists() and not (out / "final").exists()
    kept = (out / "checkpoint-1" / rundir.COMPLETE).stat().st_mtime_ns
    rerun = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)  # the lock died with it
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert rundir.verify_final(out, 3) and metric_steps(out) == [1, 2, 3]
    assert (out / "checkpoint-1" / rundir.COMPLETE).stat().st_mtime_ns == kept  # resumed from it, not redone
