"""Peak disk of a study run end to end: Snakemake in a scratch directory, its size sampled while it runs.

    python benchmarks/disk_peak.py [--repo CHECKOUT] [--study configs/tiny.yaml] [--steps 4] [--eval-every 2]

The study is the given one cut to the tiny random-init Qwen3 (``tiny-qwen3``), ``--steps`` rollout steps with a
resume checkpoint at every step, an evaluation of every ``--eval-every``-th checkpoint on arith (2 problems, 16 new
tokens, one setting), so that it takes minutes on a CPU. ``--repo`` runs another checkout's Snakefile (e.g. the
commit before a change, to compare): its ``stapo`` must be importable (PYTHONPATH=CHECKOUT). Prints the peak size of
the working directory (bytes allocated, symlinks not followed), when it happened, the final size and the wall time.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def allocated_bytes(top: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(top):
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:  # deleted while walking
                continue
            total += st.st_blocks * 512
    return total


def tiny_study(source: Path, steps: int, eval_every: int | None, keep: int | None) -> dict:
    study = yaml.safe_load(source.read_text())
    study["train"].update(max_steps=steps, save_steps=1, max_completion_length=16, save_total_limit=keep)
    arith = {**study["eval"]["benchmarks"]["arith"], "samples": 1, "limit": 2}
    study["eval"].update(benchmarks={"arith": arith}, data_dir=None, max_new_tokens=16,
                         settings={"t1.0_p1.0": study["eval"]["settings"]["t1.0_p1.0"]})
    study["workflow"].update(models=["tiny-qwen3"], eval_every=eval_every, curve_settings=["t1.0_p1.0"])
    return study


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, default=ROOT, help="the checkout whose Snakefile runs (default: this one)")
    ap.add_argument("--study", type=Path, default=ROOT / "configs" / "tiny.yaml")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--eval-every", type=int, default=2)
    ap.add_argument("--keep", type=lambda v: None if v == "all" else int(v), default=1,
                    help="train.save_total_limit: resume checkpoints kept (default 1; 'all': every one, as a study "
                         "that evaluates checkpoint-N had to before evaluation snapshots)")
    ap.add_argument("--cores", default="2")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="stapo-disk-") as tmp:
        work = Path(tmp)
        study = work / "study.yaml"
        recipe = tiny_study(args.study, args.steps, args.eval_every, args.keep)
        study.write_text(yaml.safe_dump(recipe, sort_keys=False))
        cmd = [str(Path(sys.executable).parent / "snakemake"), "-s", str(args.repo / "Snakefile"), "-d", str(work),
               "--cores", args.cores, "--configfile", str(study), "--", "results/table.md"]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        peak, peak_at, done = 0, 0.0, threading.Event()
        t0 = time.monotonic()

        def sample():
            nonlocal peak, peak_at
            while not done.is_set():
                size = allocated_bytes(work)
                if size > peak:
                    peak, peak_at = size, time.monotonic() - t0
                done.wait(0.25)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        done.set()
        sampler.join()
        seconds = time.monotonic() - t0
        final = allocated_bytes(work)
        if proc.returncode:
            print(proc.stderr[-4000:], file=sys.stderr)
            return proc.returncode
    print(f"{args.repo}: peak {peak / 1e6:,.1f} MB at {peak_at:.0f} s; final {final / 1e6:,.1f} MB; "
          f"{seconds:.0f} s ({args.steps} steps, a checkpoint each, save_total_limit {args.keep}, evaluations every "
          f"{args.eval_every})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
