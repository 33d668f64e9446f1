"""Bad inputs at every entry point: each must fail with one line naming the culprit, no traceback, fast.

    .venv/bin/python benchmarks/bench_bad_inputs.py [--only SUBSTRING] [--json OUT.json] [--in-process]

The table (CASES) covers ``stapo train | eval | report | plan``, ``snakemake -n`` on the repository's Snakefile
and ``python -m stapo.vllm_settings``: bad arguments, missing / empty / malformed files (YAML syntax: file and
line), bad values in every study section, the cross-section rules (checkpoints that will never exist,
eval_every's curve, a data_dir without the benchmarks, num_generations 1, batch splits), outputs that
cannot be written, a damaged final/ (a same-size bit flip: the SHA-256 manifest), a corrupt generation cache,
and outputs another process is writing (one writer per run directory / evaluation output). By default each case
runs as a process of its own in a scratch directory, as a user starts it; the script prints, per case, exit
status, seconds to the error, peak memory and the line. Target: every case one line, no traceback, rc != 0, and
<= 3 s to the error (none loads a model). ``--in-process`` calls every stapo / vllm_settings case's ``main`` in one
process instead (file descriptors 1 and 2 captured), recording the heavy modules each case imported (torch,
transformers, TRL, accelerate, datasets, lm-eval, vLLM: none may be) and the process's running peak memory;
tests/test_bad_inputs.py runs that batch (one process for ~75 cases) and the snakemake cases, with a generous time
bound (the machine is shared), and asserts the rest.

Issue 41 (run integrity IV) added 47 cases (``HOSTILE``): a symbolic link planted at every file a training run, an
evaluation and a report write (each pointing into a canary tree beside the scratch directory, whose checksums must
not change: ``canary``/``checksums``; tests/test_integrity.py plants one at every name a real run leaves), single-
and several-seed score cells damaged after their summary (cut, edited digest, deleted, NaN, 500, /dev/zero,
100,000 levels deep, fewer problems than the study asks, a seed missing), runs and evaluations a live process
holds, configs nested 600 deep or with a duplicate key, keys with a trailing newline or of 300 / 10,000 characters,
impossible bundled models, data rows checked before the model loads, ``--out`` that cannot be created, benchmark
lines over the line cap (the cap lowered for the case: ``Case.caps``), of 100,000 digits or 100,000 levels, a
benchmark linked to /dev/zero, and the study handed to Snakemake by ``--config study_file=FILE`` (read by stapo's
bounded reader before Snakemake sees it). Still not covered: ``snakemake --configfile FILE``, which Snakemake reads
itself before the Snakefile runs (an empty file or a YAML syntax error gets its own two-line WorkflowError); the
documented ``--config study_file=FILE`` names both file and line.

Figures (2026-12-07, the 2-core VM shared with two other sessions), default command, 129 cases: 129/129 one line
naming the culprit, rc != 0, no traceback; the canary tree unchanged; every stapo case 0.10-1.04 s at <= 71 MB
peak RSS, the 14 snakemake -n cases 1.37-2.03 s at <= 174 MB; total 59.6 s. The 47 of issue 41: 47/47, stapo cases
0.20-1.04 s at <= 71 MB, its 6 snakemake cases 1.37-1.64 s; 24.5 s. ``--in-process``: 115 cases in one process,
peak 99 MB, 3.0-3.4 s of calls.

Figures (2026-12-07, the 2-core VM, load ~2), ``--in-process``: 74/74 stapo and vllm_settings cases one line, rc
!= 0, no traceback, no heavy import (the corrupt generation cache and the damaged final/ used to import lm-eval
first: stapo eval now opens the cache and checks the model before it), the batch's peak 88-90 MB; every case
<= 0.6 s, total 1.8-3.0 s of calls in one 4 s process (the 74 processes of the default mode: ~22 s).
Figures (2026-12-05, the 2-core VM, load ~1 with a vLLM venv installing beside it), default command, 82 cases
(23 of them the over-bound inputs of issue 33: huge numbers, deep or wide YAML, aliases, long keys, 1 MiB+ files):
    82/82 one line naming the culprit, rc != 0, no traceback (the over-bound ones write nothing); every stapo case
    0.08-0.43 s at <= 67 MB peak RSS; the eight snakemake -n cases 1.19-2.14 s at <= 175 MB; total 26.6 s.
Earlier figures (2026-12-03, shared with two other sessions), 60 cases:
    load ~2.5: 59/59 (before the no-weights case was added) one line, rc != 0, no traceback; every stapo and
    vllm_settings case 0.14-1.25 s; the five snakemake -n cases 2.8-3.4 s; total 44.6 s.
    load ~5: 60/60; stapo / vllm_settings slowest 1.94 s (all 55 within 3 s); snakemake -n 6.1-7.1 s, of which
    Snakemake's own start-up is 5.5-6.3 s at that load (`snakemake --version` 5.46 s, `snakemake -n` on a missing
    Snakefile 6.30 s): the study check itself adds < 1 s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TINY = REPO / "configs" / "tiny.yaml"
MODEL, METHOD = "tiny-qwen3", "stapo"
TARGET_S = 3.0
MAX_PEAK_MB = 500  # the bounded cases' peak resident memory (snakemake's own start-up is ~180 MB)


@dataclass(frozen=True)
class Case:
    """One bad input: ``argv(work)`` -> the command line (``work`` is the scratch dir the fixtures are in), and
    the texts its one line must contain (``{work}`` is replaced by the scratch dir)."""

    name: str
    entry: str  # stapo | snakemake | vllm_settings
    args: tuple
    expect: tuple
    needs_model: bool = False
    bounded: bool = False  # an input that once sized unbounded work: refused within MAX_PEAK_MB, writing nothing
    caps: tuple = ()  # (name, value) of stapo.core.limits lowered for the case, so that no case reads gigabytes


def _study(work: Path, name: str, edit=None, **train) -> str:
    """A copy of configs/tiny.yaml (tiny-qwen3 only) with ``train`` values and an ``edit(config)``, at work/name."""
    config = yaml.safe_load(TINY.read_text(encoding="utf-8"))
    config["workflow"]["models"] = [MODEL]
    config["train"].update(train)
    if edit:
        edit(config)
    path = work / name
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return str(path)


def _set(dotted: str, value):
    def edit(config):
        *parents, last = dotted.split(".")
        node = config
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value

    return edit


def make_fixtures(work: Path) -> None:
    """The files the cases point at; none of them is a model."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "afile").write_text("x\n")
    (work / "empty.yaml").write_text("")
    text = TINY.read_text(encoding="utf-8").replace("  max_steps: 4", "  max_steps: [4", 1)
    (work / "broken.yaml").write_text(text)  # the unclosed [ is noticed on the next line
    _study(work, "good.yaml")
    _study(work, "typo.yaml", _set("stuy", "x"))
    _study(work, "neg_steps.yaml", max_steps=-1)
    _study(work, "one_gen.yaml", num_generations=1, prompts_per_step=2, per_device_train_batch_size=2)
    _study(work, "eval_every.yaml", _set("workflow.eval_every", 1), max_steps=5000)  # 4,999 curve points
    _study(work, "ckpt9.yaml", _set("workflow.checkpoints", ["final", "checkpoint-9"]))  # max_steps 4
    # 16 completions per rollout step, 8 per optimiser step: k = 2, so checkpoint-3 lies inside a rollout step
    _study(work, "ckpt_inside.yaml", _set("workflow.checkpoints", ["checkpoint-3"]), prompts_per_generation=4)
    _study(work, "no_data_dir.yaml", _set("eval.data_dir", str(work / "no-such-dir")))
    (work / "empty_data").mkdir(exist_ok=True)
    _study(work, "empty_data_dir.yaml", _set("eval.data_dir", str(work / "empty_data")))
    _study(work, "split.yaml", per_device_train_batch_size=3)
    _study(work, "lr.yaml", learning_rate="fast")
    _study(work, "bundled.yaml", _set(f"models.{MODEL}.spec", "bundled:gpt5"))
    _study(work, "verifier.yaml", _set("eval.verifier", {"model": "x/y", "temperature": 0}))
    _study(work, "samples0.yaml", _set("eval.benchmarks.arith.samples", 0))
    (work / "bad_rows").mkdir(exist_ok=True)
    (work / "bad_rows" / "aime24.jsonl").write_text('{"id": "a", "problem": "1+1?", "answer": "2"}\n'
                                                    '{"id": "b", "problem": "2+2?"}\n')
    (work / "no_weights").mkdir(exist_ok=True)
    (work / "no_weights" / "config.json").write_text('{"model_type": "qwen3"}')
    _bounded_fixtures(work)
    _hostile_fixtures(work)
    (work / "cache").mkdir(exist_ok=True)
    (work / "cache" / "o.jsonl.cache.sqlite").write_bytes(b"not a database" * 100)
    _damaged_final(work / "run")


# eval.hf holds 9 levels of 9 aliases: 4.5 KB of YAML, 9^9 values once expanded
BOMB = "".join(f"    {name}: &{name} [{', '.join([f'*{prev}'] * 9)}]\n" for prev, name in zip("abcdefgh", "bcdefghi"))


def _bounded_fixtures(work: Path) -> None:
    """Inputs that once sized unbounded work or left the study's directories (issue: run integrity III)."""
    _study(work, "huge_steps.yaml", max_steps=10**12)
    _study(work, "huge_lr.yaml", learning_rate=1e308)
    text = (work / "good.yaml").read_text(encoding="utf-8")
    (work / "nan_lr.yaml").write_text(text.replace("learning_rate: 1.0e-05", "learning_rate: .nan"))
    bomb = '  hf:\n    a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]\n' + BOMB
    (work / "bomb.yaml").write_text(text.replace("\neval:\n", "\neval:\n" + bomb, 1))
    _study(work, "dotdot.yaml", lambda c: c["models"].update({"..": c["models"][MODEL]}) or
           c["workflow"].update(models=[".."]))
    (work / "latin1.yaml").write_bytes(text.replace("study: tiny", "study: tiny # caf\u00e9").encode("latin-1"))
    (work / "dup_ids").mkdir(exist_ok=True)
    (work / "dup_ids" / "aime24.jsonl").write_text('{"id": "a", "problem": "1+1?", "answer": "2"}\n'
                                                  '{"id": "a", "problem": "2+2?", "answer": "4"}\n')
    (work / "latin1_rows").mkdir(exist_ok=True)
    (work / "latin1_rows" / "aime24.jsonl").write_bytes('{"id": "a", "problem": "caf\u00e9?", "answer": "2"}\n'
                                                        .encode("latin-1"))
    cut = work / "cut_weights"
    cut.mkdir(exist_ok=True)
    (cut / "config.json").write_text('{"model_type": "qwen3"}')
    header = json.dumps({"w": {"dtype": "F32", "shape": [256], "data_offsets": [0, 1024]}}).encode()
    (cut / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(500))
    _damaged_scores(work / "short_scores", "short")
    _damaged_scores(work / "mid_line_scores", "mid-line")


def canary(work: Path) -> Path:
    """A tree outside the scratch directory that every planted link points into: no case may change it."""
    return work.parent / f"{work.name}-canary"


def checksums(tree: Path) -> dict[str, str]:
    """{relative path: SHA-256} of every file under ``tree``."""
    import hashlib

    return {str(p.relative_to(tree)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(tree.rglob("*")) if p.is_file()}


def _plant(path: Path, target: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        path.unlink()
    path.symlink_to(target)


TRAIN_LINKS = ("stapo.lock", "metrics.jsonl", "config.yaml", "diagnostics.jsonl", "final")
EVAL_LINKS = ("aime24.jsonl.lock", "aime24.summary.json", "aime24.jsonl.cache.sqlite", "aime24.jsonl")
REPORT_LINKS = ("table.md", "scores.csv", "cost.md")


def _hostile_fixtures(work: Path) -> None:
    """Inputs of issue 41 (run integrity IV): planted links, damaged single- and several-seed cells, unbounded or
    deep files, keys with a trailing newline, impossible bundled models, late errors."""
    tree = canary(work)
    (tree / "sub").mkdir(parents=True, exist_ok=True)
    (tree / "v").write_text("keep\n")
    (tree / "sub" / "w.jsonl").write_text('{"step": 1}\n')
    for name in TRAIN_LINKS:
        _plant(work / "links" / "train" / name.replace(".", "_") / name, tree / ("sub" if name == "final" else "v"))
    for name in EVAL_LINKS:
        _plant(work / "links" / "eval" / name.replace(".", "_") / name, tree / "v")
    for name in REPORT_LINKS:
        _plant(work / "links" / "report" / name.replace(".", "_") / name, tree / "v")
    (work / "empty_scores").mkdir(exist_ok=True)
    text = (work / "good.yaml").read_text(encoding="utf-8")
    (work / "deep.yaml").write_text(text + "x: " + "[" * 600 + "]" * 600 + "\n")  # 2 KB of nesting
    (work / "dup_key.yaml").write_text(text.replace("train:\n", "train:\n  max_steps: 3\n", 1))
    (work / "seeds.yaml").write_text(text.replace("workflow:\n", "workflow:\n  seeds: [" + ", ".join(
        map(str, range(200_000))) + "]\n", 1))  # 1.3 MB: over the 1 MiB a study may hold
    _study(work, "newline_key.yaml", lambda c: c["methods"].update({"grpo\n": {"objective": "grpo"}}))
    _study(work, "long_key.yaml", lambda c: c["methods"].update({"m" * 300: {"objective": "grpo"}}))
    _study(work, "long_model.yaml", lambda c: c["models"].update({"m" * 10_000: c["models"][MODEL]}))
    _study(work, "heads0.yaml", _set(f"models.{MODEL}.spec", "bundled:tiny-qwen3?heads=0"))
    _study(work, "hidden1e7.yaml", _set(f"models.{MODEL}.spec", "bundled:tiny-qwen3?hidden=10000000"))
    (work / "rows").mkdir(exist_ok=True)
    (work / "rows" / "no_answer.jsonl").write_text('{"problem": "1+1?", "answer": "2"}\n{"problem": "2+2?"}\n')
    _study(work, "no_answer_rows.yaml", _set("train.dataset", {"path": str(work / "rows" / "no_answer.jsonl")}))
    for name, line in (("long_line", '{"id": "a", "problem": "' + "x" * 3_000_000 + '", "answer": "2"}'),
                       ("digits", '{"id": "a", "problem": "p", "answer": ' + "9" * 100_000 + "}"),
                       ("deep_row", '{"id": "a", "problem": ' + "[" * 100_000 + "]" * 100_000 + ', "answer": "2"}')):
        (work / name).mkdir(exist_ok=True)
        (work / name / "aime24.jsonl").write_text(line + "\n")
    (work / "zero_rows").mkdir(exist_ok=True)
    _plant(work / "zero_rows" / "aime24.jsonl", Path("/dev/zero"))
    _hostile_scores(work)


def _hostile_scores(work: Path) -> None:
    """Single-seed cells damaged after their summary was written, and scores/runs pointed at /dev/zero."""
    from stapo.eval.scoring import samples_file_digest, summary_of

    damages = ("cut", "digest", "deleted", "nan", "500", "dev_zero", "deep", "problems")
    for damage in damages:
        path = work / "cells" / damage / "m" / "stapo" / "final" / "arith" / "t1.0_p1.0.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = "".join(json.dumps({"problem_id": f"p{p}", "sample": 0, "correct": p % 2 == 0}) + "\n"
                       for p in range(12)).encode()
        path.write_bytes(data)
        summary = {"avg_at_n": 50.0, "ci95": [20.0, 80.0], "n_samples": 1, "problems": 12, "samples": 12,
                   "samples_file": samples_file_digest(data)}
        if damage in ("nan", "500"):
            summary["avg_at_n"] = {"nan": float("nan"), "500": 500.0}[damage]
        if damage == "digest":
            summary["samples_file"]["sha256"] = "0" * 64
        text = json.dumps(summary)
        if damage == "deep":
            text = text[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
        summary_of(path).unlink(missing_ok=True)
        if damage == "dev_zero":
            summary_of(path).symlink_to("/dev/zero")
        else:
            summary_of(path).write_text(text)
        if damage == "cut":
            path.write_bytes(b"".join(data.splitlines(keepends=True)[:5]))
        elif damage == "deleted":
            path.unlink()
    study = yaml.safe_load((work / "good.yaml").read_text(encoding="utf-8"))
    study["eval"]["benchmarks"] = {"arith": {"samples": 1, "n": 48, "limit": 48}}  # 48 asked, the cell holds 12
    (work / "arith48.yaml").write_text(yaml.safe_dump(study, sort_keys=False))
    _damaged_scores(work / "deleted_seed_scores", "deleted")
    metrics = work / "zero_runs" / "m" / "stapo" / "metrics.jsonl"
    _plant(metrics, Path("/dev/zero"))
    (work / "live_runs" / "m" / "stapo").mkdir(parents=True, exist_ok=True)
    (work / "live_runs" / "m" / "stapo" / "metrics.jsonl").write_text('{"step": 1}\n')
    live = work / "live_scores" / "m" / "stapo" / "final" / "arith" / "t1.0_p1.0.jsonl"
    live.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(work / "cells" / "problems" / "m" / "stapo" / "final" / "arith" / "t1.0_p1.0.jsonl", live)
    shutil.copyfile(summary_of(work / "cells" / "problems" / "m" / "stapo" / "final" / "arith" / "t1.0_p1.0.jsonl"),
                    summary_of(live))


def _damaged_scores(scores: Path, damage: str) -> None:
    """A three-seed cell whose seed1 per-sample file was damaged after its summary was written: ``short`` cuts it to
    half its lines, ``mid-line`` cuts its last line mid-way (and its summary predates the checksum), ``deleted``
    removes it."""
    from stapo.eval.scoring import samples_file_digest, summary_of

    for seed in range(3):
        path = scores / "m" / "stapo" / f"seed{seed}" / "final" / "arith" / "t1.0_p1.0.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = "".join(json.dumps({"problem_id": f"p{p}", "sample": 0, "correct": p % 2 == 0}) + "\n"
                       for p in range(12)).encode()
        path.write_bytes(data)
        summary = {"avg_at_n": 50.0, "ci95": [20.0, 80.0], "n_samples": 1, "problems": 12, "samples": 12}
        if not (seed == 1 and damage == "mid-line"):
            summary["samples_file"] = samples_file_digest(data)
        summary_of(path).write_text(json.dumps(summary))
        if seed == 1 and damage == "deleted":
            path.unlink()
        elif seed == 1:
            path.write_bytes(b"".join(data.splitlines(keepends=True)[:6]) if damage == "short" else data[:-10])


def _damaged_final(run: Path) -> None:
    """A run directory whose final/ verified when written and then had one bit flipped (same size, same mtime)."""
    from stapo.core.manifest import FINAL_COMPLETE, write_manifest

    final = run / "final"
    if final.exists():
        shutil.rmtree(final)
    final.mkdir(parents=True)
    (run / "config.yaml").write_text("model: {key: tiny-qwen3}\n")
    (final / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    header = json.dumps({"w": {"dtype": "F32", "shape": [256], "data_offsets": [0, 1024]}}).encode()
    (final / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(1024))
    write_manifest(final, FINAL_COMPLETE, 4)
    path = final / "model.safetensors"
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


HOLD = ("import sys, time\nfrom stapo.core.lock import {fn}\nwith {fn}(sys.argv[1]):\n"
        "    print('held', flush=True)\n    time.sleep(3600)\n")


def hold_in_background(fn: str, path: Path) -> subprocess.Popen:
    """A process holding the run lock (``run_lock``) or an evaluation output's lock (``output_lock``)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD.format(fn=fn), str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


T = ("train", "--model", MODEL, "--method", METHOD)
# CPU-sized (hf, one short sample): the paper's sizes without a GPU are a case of their own, refused first
E = ("eval", "--model", "bundled:tiny-qwen3", "--benchmark", "aime24", "--setting", "t1.0_p1.0", "--backend", "hf",
     "--samples", "1", "--max-new-tokens", "8")
OUT = ("--out", "{work}/o/aime24.jsonl")

R = ("report", "--scores")
BOUNDED_OUT = ("--out", "{work}/bounded")
LINK = "is a symbolic link"
# issue 41 (run integrity IV): each a clean one-line refusal, none of them changing the canary tree outside {work}
HOSTILE = [
    *[Case(f"train: planted link {name}", "stapo", (*T, "--recipe", "{work}/good.yaml", "--out",
                                                   f"{{work}}/links/train/{name.replace('.', '_')}"),
           (f"{{work}}/links/train/{name.replace('.', '_')}/{name} {LINK}",)) for name in TRAIN_LINKS],
    *[Case(f"eval: planted link {name}", "stapo", (*E, "--out",
                                                  f"{{work}}/links/eval/{name.replace('.', '_')}/aime24.jsonl"),
           (f"{{work}}/links/eval/{name.replace('.', '_')}/{name} {LINK}",)) for name in EVAL_LINKS],
    *[Case(f"report: planted link {name}", "stapo", (*R, "{work}/empty_scores", "--runs", "{work}/empty_scores",
                                                    "--out", f"{{work}}/links/report/{name.replace('.', '_')}"),
           (f"{{work}}/links/report/{name.replace('.', '_')}/{name} {LINK}",)) for name in REPORT_LINKS],
    *[Case(f"report: single-seed cell {what}", "stapo", (*R, f"{{work}}/cells/{damage}", *BOUNDED_OUT), expect,
           bounded=True) for damage, what, expect in (
        ("cut", "cut to 5 of 12 lines", ("{work}/cells/cut/m/stapo/final/arith/t1.0_p1.0.jsonl: 5 lines",
                                         "recorded 12 lines")),
        ("digest", "with an edited digest", ("{work}/cells/digest/m/stapo/final/arith/t1.0_p1.0.jsonl: 12 lines",
                                             "000000000000")),
        ("deleted", "without its samples file", ("{work}/cells/deleted/m/stapo/final/arith/t1.0_p1.0.jsonl: "
                                                 "missing",)),
        ("nan", "avg_at_n NaN", ("t1.0_p1.0.summary.json: avg_at_n is nan, not a percentage",)),
        ("500", "avg_at_n 500", ("t1.0_p1.0.summary.json: avg_at_n is 500.0, not a percentage",)),
        ("dev_zero", "summary linked to /dev/zero", ("t1.0_p1.0.summary.json: is a character device",)),
        ("deep", "summary nested 100,000 deep", ("t1.0_p1.0.summary.json: nested more than 64 levels",)))],
    Case("report: a cell with fewer problems than the study asks", "stapo",
         (*R, "{work}/cells/problems", "--config", "{work}/arith48.yaml", *BOUNDED_OUT),
         ("t1.0_p1.0.summary.json: 12 problems", "asks for 48"), bounded=True),
    Case("report: several-seed cell missing a seed's samples", "stapo", (*R, "{work}/deleted_seed_scores",
                                                                       *BOUNDED_OUT),
         ("{work}/deleted_seed_scores/m/stapo/seed1/final/arith/t1.0_p1.0.jsonl: missing (1 of the cell's 3 seeds)",),
         bounded=True),
    Case("report: metrics.jsonl linked to /dev/zero", "stapo", (*R, "{work}/empty_scores", "--runs",
                                                               "{work}/zero_runs", *BOUNDED_OUT),
         ("{work}/zero_runs/m/stapo/metrics.jsonl: is a character device",), bounded=True),
    Case("report: a run a live trainer holds", "stapo", (*R, "{work}/empty_scores", "--runs", "{work}/live_runs",
                                                        *BOUNDED_OUT),
         ("{work}/live_runs/m/stapo: still being trained (PID",), bounded=True),
    Case("report: an evaluation a live writer holds", "stapo", (*R, "{work}/live_scores", *BOUNDED_OUT),
         ("live_scores/m/stapo/final/arith/t1.0_p1.0.jsonl: its evaluation is still running (PID",), bounded=True),
    *[Case(what, "stapo", args, expect, bounded=True) for what, args, expect in (
        ("train: config nested 600 deep", (*T, "--recipe", "{work}/deep.yaml", "--out", "{work}/bounded"),
         ("{work}/deep.yaml:", "nested more than 64 levels deep")),
        ("plan: config nested 600 deep", ("plan", "--configfile", "{work}/deep.yaml"), ("{work}/deep.yaml:",
                                                                                        "nested more than 64")),
        ("eval: recipe nested 600 deep", (*E, "--out", "{work}/bounded/o.jsonl", "--recipe", "{work}/deep.yaml"),
         ("{work}/deep.yaml:", "nested more than 64")),
        ("report: config nested 600 deep", (*R, "{work}/empty_scores", "--config", "{work}/deep.yaml",
                                            *BOUNDED_OUT), ("{work}/deep.yaml:", "nested more than 64")),
        ("train: duplicate YAML key", (*T, "--recipe", "{work}/dup_key.yaml", "--out", "{work}/bounded"),
         ("{work}/dup_key.yaml:", "duplicate key 'max_steps'")),
        ("plan: 200,000 seeds (1.3 MB)", ("plan", "--configfile", "{work}/seeds.yaml"),
         ("{work}/seeds.yaml: larger than 1 MiB",)),
        ("plan: method key with a trailing newline", ("plan", "--configfile", "{work}/newline_key.yaml"),
         ("methods: 'grpo\\n' does not match",)),
        ("plan: a 300-character method key", ("plan", "--configfile", "{work}/long_key.yaml"),
         ("methods: 'mmmm", "(300 characters) is not a valid key")),
        ("plan: bundled:tiny-qwen3?heads=0", ("plan", "--configfile", "{work}/heads0.yaml"),
         ("models.tiny-qwen3.spec", "heads: must be in [1, 128]")),
        ("plan: bundled:tiny-qwen3?hidden=10000000", ("plan", "--configfile", "{work}/hidden1e7.yaml"),
         ("models.tiny-qwen3.spec", "hidden: must be in [1, 8,192]")),
        ("train: a data row without answer, before the model loads", (*T, "--recipe", "{work}/no_answer_rows.yaml",
                                                                      "--out", "{work}/bounded"),
         ("train.dataset.path", "{work}/rows/no_answer.jsonl:2: missing field 'answer'")),
        ("train: --out a 300-character name", (*T, "--recipe", "{work}/good.yaml", "--out", "{work}/" + "x" * 300),
         ("--out: cannot create", "File name too long")),
        ("train: --out under /proc", (*T, "--recipe", "{work}/good.yaml", "--out", "/proc/stapo-out"),
         ("--out", "/proc/stapo-out")),
        ("eval: a benchmark line over the line cap", (*E, "--out", "{work}/bounded/o.jsonl", "--data-dir",
                                                      "{work}/long_line"),
         ("{work}/long_line/aime24.jsonl:1: a line of 3,000,0", "at most 1,048,576")),
        ("eval: a 100,000-digit number in a benchmark", (*E, "--out", "{work}/bounded/o.jsonl", "--data-dir",
                                                         "{work}/digits"),
         ("{work}/digits/aime24.jsonl:1: invalid JSON", "4300 digits")),
        ("eval: a benchmark row nested 100,000 deep", (*E, "--out", "{work}/bounded/o.jsonl", "--data-dir",
                                                       "{work}/deep_row"),
         ("{work}/deep_row/aime24.jsonl:1: nested more than 64",)),
        ("eval: a benchmark file linked to /dev/zero", (*E, "--out", "{work}/bounded/o.jsonl", "--data-dir",
                                                        "{work}/zero_rows"),
         ("{work}/zero_rows/aime24.jsonl: is a character device",)),
    )],
    *[Case(f"snakemake -n: study_file {what}", "snakemake", ("--config", f"study_file={name}"), expect,
           bounded=True) for what, name, expect in (
        ("not UTF-8", "{work}/latin1.yaml", ("{work}/latin1.yaml: not UTF-8 text",)),
        ("nested 600 deep", "{work}/deep.yaml", ("{work}/deep.yaml:", "nested more than 64")),
        ("with a duplicate key", "{work}/dup_key.yaml", ("{work}/dup_key.yaml:", "duplicate key 'max_steps'")),
        ("of 200,000 seeds", "{work}/seeds.yaml", ("{work}/seeds.yaml: larger than 1 MiB",)),
        ("with a 10,000-character model key", "{work}/long_model.yaml", ("(10,000 characters) is not a valid key",)),
        ("and its overlay with a newline key", "[{work}/good.yaml,{work}/newline_key.yaml]",
         ("methods: 'grpo\\n' does not match",)))],
]
LOWER_CAPS = {"eval: a benchmark line over the line cap": (("MAX_LINE_BYTES", 1 << 20),)}
HOSTILE = [Case(**{**c.__dict__, "caps": LOWER_CAPS.get(c.name, ())}) for c in HOSTILE]

CASES = [
    Case("stapo: no subcommand", "stapo", (), ("arguments are required",)),
    Case("stapo: unknown subcommand", "stapo", ("nope",), ("invalid choice: 'nope'",)),
    Case("train: no arguments", "stapo", ("train",), ("--recipe", "--out")),
    Case("train: recipe not found", "stapo", (*T, "--recipe", "{work}/missing.yaml", "--out", "{work}/r"),
         ("{work}/missing.yaml: file not found",)),
    Case("train: YAML syntax error", "stapo", (*T, "--recipe", "{work}/broken.yaml", "--out", "{work}/r"),
         ("{work}/broken.yaml:", "YAML syntax error")),
    Case("train: empty recipe", "stapo", (*T, "--recipe", "{work}/empty.yaml", "--out", "{work}/r"),
         ("{work}/empty.yaml", "models")),
    Case("train: unknown top-level key", "stapo", (*T, "--recipe", "{work}/typo.yaml", "--out", "{work}/r"),
         ("stuy: unknown key",)),
    Case("train: max_steps -1", "stapo", (*T, "--recipe", "{work}/neg_steps.yaml", "--out", "{work}/r"),
         ("train.max_steps",)),
    Case("train: --max-steps -1", "stapo", (*T, "--recipe", "{work}/good.yaml", "--out", "{work}/r",
                                            "--max-steps", "-1"), ("train.max_steps", "-1")),
    Case("train: --max-steps not a number", "stapo", (*T, "--recipe", "{work}/good.yaml", "--out", "{work}/r",
                                                      "--max-steps", "ten"), ("--max-steps", "'ten'")),
    Case("train: num_generations 1", "stapo", (*T, "--recipe", "{work}/one_gen.yaml", "--out", "{work}/r"),
         ("train.num_generations: must be >= 2",)),
    Case("train: unknown model key", "stapo", ("train", "--model", "nope", "--method", METHOD, "--recipe",
                                               "{work}/good.yaml", "--out", "{work}/r"), ("models: no 'nope'",)),
    Case("train: unknown method key", "stapo", ("train", "--model", MODEL, "--method", "ppo", "--recipe",
                                                "{work}/good.yaml", "--out", "{work}/r"), ("methods: no 'ppo'",)),
    Case("train: eval_every puts thousands of points on the curve", "stapo",
         (*T, "--recipe", "{work}/eval_every.yaml", "--out", "{work}/r"), ("workflow.eval_every (1) puts 4,999",)),
    Case("train: workflow checkpoint past max_steps", "stapo",
         (*T, "--recipe", "{work}/ckpt9.yaml", "--out", "{work}/r"), ("workflow.checkpoints: checkpoint-9",)),
    Case("train: workflow checkpoint inside a rollout step", "stapo",
         (*T, "--recipe", "{work}/ckpt_inside.yaml", "--out", "{work}/r"), ("checkpoint-3", "k = 2")),
    Case("train: eval.data_dir missing", "stapo", (*T, "--recipe", "{work}/no_data_dir.yaml", "--out", "{work}/r"),
         ("eval.data_dir: directory {work}/no-such-dir not found",)),
    Case("train: eval.data_dir without the benchmarks", "stapo",
         (*T, "--recipe", "{work}/empty_data_dir.yaml", "--out", "{work}/r"), ("eval.data_dir", "aime24.jsonl")),
    Case("train: batch split", "stapo", (*T, "--recipe", "{work}/split.yaml", "--out", "{work}/r"),
         ("per_device_train_batch_size",)),
    Case("train: wrong type", "stapo", (*T, "--recipe", "{work}/lr.yaml", "--out", "{work}/r"),
         ("train.learning_rate",)),
    Case("train: unknown bundled model", "stapo", (*T, "--recipe", "{work}/bundled.yaml", "--out", "{work}/r"),
         ("bundled:gpt5",)),
    Case("train: --out under a file", "stapo", (*T, "--recipe", "{work}/good.yaml", "--out", "{work}/afile/r"),
         ("--out", "{work}/afile is a file")),
    Case("train: run directory in use", "stapo", (*T, "--recipe", "{work}/good.yaml", "--out", "{work}/busy"),
         ("run directory {work}/busy is in use by PID",)),
    Case("eval: no arguments", "stapo", ("eval",), ("arguments are required", "--out")),
    Case("eval: --out under a file", "stapo", (*E, "--out", "{work}/afile/x.jsonl"), ("--out", "{work}/afile")),
    Case("eval: --out not .jsonl", "stapo", (*E, "--out", "{work}/o/x.txt"), ("--out", "must end in .jsonl")),
    Case("eval: model directory missing", "stapo", ("eval", "--model", "{work}/runs/m/final", "--benchmark",
                                                    "aime24", "--setting", "t1.0_p1.0", *OUT),
         ("--model", "{work}/runs/m/final")),
    Case("eval: model directory without weights", "stapo", ("eval", "--model", "{work}/no_weights", "--benchmark",
                                                            "aime24", "--setting", "t1.0_p1.0", *OUT),
         ("--model", "{work}/no_weights has no weights file")),
    Case("eval: unknown bundled model", "stapo", ("eval", "--model", "bundled:nope", "--benchmark", "aime24",
                                                  "--setting", "t1.0_p1.0", *OUT), ("--model", "bundled:nope")),
    Case("eval: --data-dir missing", "stapo", (*E, *OUT, "--data-dir", "{work}/no-such-dir"),
         ("--data-dir", "{work}/no-such-dir not found")),
    Case("eval: benchmark file missing", "stapo", (*E, *OUT, "--data-dir", "{work}/empty_data"),
         ("{work}/empty_data/aime24.jsonl not found",)),
    Case("eval: row without answer", "stapo", (*E, *OUT, "--data-dir", "{work}/bad_rows"),
         ("{work}/bad_rows/aime24.jsonl:2: missing field(s) ['answer']",)),
    Case("eval: --samples 0", "stapo", (*E, *OUT, "--samples", "0"), ("--samples: must be >= 1",)),
    Case("eval: --limit 0", "stapo", (*E, *OUT, "--limit", "0"), ("--limit: must be >= 1",)),
    Case("eval: --max-new-tokens -5", "stapo", (*E, *OUT, "--max-new-tokens", "-5"), ("--max-new-tokens",)),
    Case("eval: --grade-timeout 0", "stapo", (*E, *OUT, "--grade-timeout", "0"), ("--grade-timeout",)),
    Case("eval: unknown setting", "stapo", ("eval", "--model", "bundled:tiny-qwen3", "--benchmark", "aime24",
                                            "--setting", "t9", *OUT), ("--setting", "'t9'")),
    Case("eval: unknown benchmark", "stapo", ("eval", "--model", "bundled:tiny-qwen3", "--benchmark", "aime99",
                                              "--setting", "t1.0_p1.0", *OUT), ("--benchmark", "'aime99'")),
    Case("eval: recipe YAML syntax error", "stapo", (*E, *OUT, "--recipe", "{work}/broken.yaml"),
         ("{work}/broken.yaml:", "YAML syntax error")),
    Case("eval: recipe samples 0", "stapo", (*E, *OUT, "--recipe", "{work}/samples0.yaml"),
         ("eval.benchmarks.arith.samples",)),
    Case("eval: recipe verifier key", "stapo", (*E, *OUT, "--recipe", "{work}/verifier.yaml"),
         ("eval.verifier", "temperature")),
    Case("eval: corrupt generation cache", "stapo", (*E, "--out", "{work}/cache/o.jsonl"),
         ("generation cache {work}/cache/o.jsonl.cache.sqlite",)),
    Case("eval: damaged final/ (same-size bit flip)", "stapo",
         ("eval", "--model", "{work}/run/final", "--benchmark", "aime24", "--setting", "t1.0_p1.0", *E[7:], *OUT),
         ("{work}/run/final", "model.safetensors content differs", "final.damaged-")),
    Case("eval: output in use", "stapo", (*E, "--out", "{work}/busy_eval/aime24.jsonl"),
         ("evaluation output {work}/busy_eval/aime24.jsonl is in use by PID",)),
    Case("report: config not found", "stapo", ("report", "--config", "{work}/missing.yaml", "--out", "{work}/res"),
         ("{work}/missing.yaml: file not found",)),
    Case("report: config YAML syntax error", "stapo", ("report", "--config", "{work}/broken.yaml", "--out",
                                                       "{work}/res"), ("{work}/broken.yaml:", "YAML syntax")),
    Case("report: scores directory missing", "stapo", ("report", "--scores", "{work}/no-scores", "--out",
                                                       "{work}/res"), ("--scores", "{work}/no-scores")),
    Case("report: --out under a file", "stapo", ("report", "--scores", "{work}", "--out", "{work}/afile/res"),
         ("--out", "{work}/afile")),
    Case("plan: configfile not found", "stapo", ("plan", "--configfile", "{work}/missing.yaml"),
         ("--configfile", "{work}/missing.yaml not found")),
    Case("plan: configfile YAML syntax error", "stapo", ("plan", "--configfile", "{work}/broken.yaml"),
         ("{work}/broken.yaml:", "YAML syntax error")),
    Case("plan: configfile bad key", "stapo", ("plan", "--configfile", "{work}/typo.yaml"), ("stuy: unknown key",)),
    Case("plan: --params malformed", "stapo", ("plan", "--configfile", "{work}/good.yaml", "--params", "tiny"),
         ("--params",)),
    Case("plan: throughputs file missing", "stapo", ("plan", "--throughputs", "{work}/missing-tp.yaml"),
         ("--throughputs", "{work}/missing-tp.yaml")),
    Case("snakemake -n: unknown key", "snakemake", ("--configfile", "{work}/typo.yaml"), ("stuy: unknown key",)),
    Case("snakemake -n: eval_every, thousands of curve points", "snakemake", ("--configfile", "{work}/eval_every.yaml"),
         ("workflow.eval_every",)),
    Case("snakemake -n: checkpoint past max_steps", "snakemake", ("--configfile", "{work}/ckpt9.yaml"),
         ("workflow.checkpoints: checkpoint-9",)),
    Case("snakemake -n: eval.data_dir missing", "snakemake", ("--configfile", "{work}/no_data_dir.yaml"),
         ("eval.data_dir",)),
    Case("snakemake -n: num_generations 1", "snakemake", ("--configfile", "{work}/one_gen.yaml"),
         ("train.num_generations",)),
    *[Case(what if entry == "stapo" else f"{entry} {what}", entry, args, expect, bounded=True)
      for entry, what, args, expect in (
        ("stapo", "train: max_steps 10**12", (*T, "--recipe", "{work}/huge_steps.yaml", "--out", "{work}/bounded"),
         ("train.max_steps: must be in [1, 1,000,000]",)),
        ("stapo", "plan: max_steps 10**12", ("plan", "--configfile", "{work}/huge_steps.yaml"), ("train.max_steps",)),
        ("snakemake", "-n: max_steps 10**12", ("--configfile", "{work}/huge_steps.yaml"), ("train.max_steps",)),
        ("stapo", "train: YAML alias bomb", (*T, "--recipe", "{work}/bomb.yaml", "--out", "{work}/bounded"),
         ("{work}/bomb.yaml", "YAML aliases")),
        ("stapo", "plan: YAML alias bomb", ("plan", "--configfile", "{work}/bomb.yaml"), ("YAML aliases",)),
        ("snakemake", "-n: YAML alias bomb", ("--configfile", "{work}/bomb.yaml"), ("YAML aliases",)),
        ("stapo", "train: model key ..", ("train", "--model", "..", "--method", METHOD, "--recipe",
                                          "{work}/dotdot.yaml", "--out", "{work}/bounded"), ("models: '..'",)),
        ("snakemake", "-n: model key ..", ("--configfile", "{work}/dotdot.yaml"), ("models: '..'", "never . or ..")),
        ("stapo", "train: learning_rate 1e308", (*T, "--recipe", "{work}/huge_lr.yaml", "--out", "{work}/bounded"),
         ("train.learning_rate: must be in [0, 1]",)),
        ("stapo", "train: learning_rate .nan", (*T, "--recipe", "{work}/nan_lr.yaml", "--out", "{work}/bounded"),
         ("train.learning_rate: must be a finite number, got nan",)),
        ("stapo", "train: --seed -1", (*T, "--recipe", "{work}/good.yaml", "--out", "{work}/bounded", "--seed",
                                       "-1"), ("train.seed: must be in [0, 4,294,967,295]",)),
        ("stapo", "train: recipe not UTF-8", (*T, "--recipe", "{work}/latin1.yaml", "--out", "{work}/bounded"),
         ("{work}/latin1.yaml: not UTF-8 text",)),
        ("stapo", "eval: --seed -1", (*E, "--out", "{work}/bounded/o.jsonl", "--seed", "-1"), ("--seed",)),
        ("stapo", "eval: --grade-timeout 1e308", (*E, "--out", "{work}/bounded/o.jsonl", "--grade-timeout", "1e308"),
         ("--grade-timeout: must be in [0, 3,600]",)),
        ("stapo", "eval: --grade-timeout nan", (*E, "--out", "{work}/bounded/o.jsonl", "--grade-timeout", "nan"),
         ("--grade-timeout: must be a finite number",)),
        ("stapo", "eval: --samples 10**9", (*E, "--out", "{work}/bounded/o.jsonl", "--samples", "1000000000"),
         ("--samples: must be in [1, 1,024]",)),
        ("stapo", "eval: --max-new-tokens 10**12", (*E, "--out", "{work}/bounded/o.jsonl", "--max-new-tokens",
                                                     "1000000000000"), ("--max-new-tokens: must be in",)),
        ("stapo", "eval: repeated problem id", (*E, "--out", "{work}/bounded/o.jsonl", "--data-dir",
                                                "{work}/dup_ids"), ("{work}/dup_ids/aime24.jsonl:2: id 'a' repeats",)),
        ("stapo", "eval: benchmark file not UTF-8", (*E, "--out", "{work}/bounded/o.jsonl", "--data-dir",
                                                     "{work}/latin1_rows"),
         ("{work}/latin1_rows/aime24.jsonl:1: not UTF-8",)),
        ("stapo", "eval: truncated weights, no manifest", ("eval", "--model", "{work}/cut_weights", "--benchmark",
                                                           "aime24", "--setting", "t1.0_p1.0", "--out",
                                                           "{work}/bounded/o.jsonl"),
         ("--model: {work}/cut_weights has incomplete files (model.safetensors: 574 bytes, header needs 1098)",)),
        ("stapo", "report: several-seed file cut short", ("report", "--scores", "{work}/short_scores", "--out",
                                                          "{work}/bounded"),
         ("seed1/final/arith/t1.0_p1.0.jsonl: 6 lines", "its summary recorded 12 lines")),
        ("stapo", "report: a line cut mid-way", ("report", "--scores", "{work}/mid_line_scores", "--out",
                                                 "{work}/bounded"),
         ("seed1/final/arith/t1.0_p1.0.jsonl:12: not a JSON record",)),
    )],
    *HOSTILE,
    Case("vllm_settings: no command", "vllm_settings", (), ("arguments are required",)),
    Case("vllm_settings: unknown device", "vllm_settings", ("check", "--device", "tpu"), ("invalid choice: 'tpu'",)),
]


def command(case: Case, work: Path) -> list[str]:
    args = [a.format(work=work) for a in case.args]
    if case.entry == "stapo" and case.caps:  # the console script, with stapo.core.limits lowered first
        lower = "; ".join(f"limits.{name} = {value!r}" for name, value in case.caps)
        return [sys.executable, "-c", f"import sys; from stapo.core import limits; {lower}; from stapo.cli import "
                "main; sys.exit(main())", *args]
    if case.entry == "stapo":
        return [str(BIN / "stapo"), *args]
    if case.entry == "snakemake":
        return [str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "-d", str(work / "sm"), "-n", *args]
    return [sys.executable, "-m", "stapo.vllm_settings", *args]


def env() -> dict:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "STAPO_DEBUG": "0"}


def _prepare(case: Case, work: Path) -> None:
    if case.name == "eval: damaged final/ (same-size bit flip)":
        _damaged_final(work / "run")  # a previous run of the case moved it aside
    shutil.rmtree(work / "bounded", ignore_errors=True)


def _result(case: Case, work: Path, rc: int, stdout: str, stderr: str, seconds: float, peak_mb: float,
            heavy: list[str] | None = None) -> dict:
    lines = [line for line in stderr.splitlines() if line.strip()]
    expect = [e.format(work=work) for e in case.expect]
    return {"name": case.name, "rc": rc, "seconds": round(seconds, 2), "lines": lines, "peak_mb": peak_mb,
            "stdout": stdout, "missing": [e for e in expect if not any(e in line for line in lines)],
            "traceback": "Traceback" in stderr + stdout, "wrote": (work / "bounded").exists(), "heavy": heavy}


def run_case(case: Case, work: Path, cwd: Path = REPO) -> dict:
    """Run one case as its own process; its rc, stderr lines, seconds to the error and whether the line says what
    it must."""
    _prepare(case, work)
    start = time.monotonic()
    rc, stdout, stderr, peak_kb = _run_measured(command(case, work), cwd, timeout=300)
    return _result(case, work, rc, stdout, stderr, time.monotonic() - start, peak_kb / 1024)


# ------------------------------------------------------------------ in-process: every case of one process

# imported by a stage (the trainer, lm-eval, vLLM) and never needed to refuse a bad input
HEAVY_MODULES = ("torch", "transformers", "trl", "accelerate", "datasets", "lm_eval", "vllm")
IN_PROCESS = ("stapo", "vllm_settings")  # the entries whose main() this process can call; snakemake stays a process


def _entry_main(entry: str):
    if entry == "stapo":
        from stapo.cli import main
    else:
        from stapo.vllm_settings import main
    return main


def _call(main, args: list[str]) -> int:
    """``main(args)`` as the console script runs it: SystemExit's code, or 1 and the traceback on stderr."""
    try:
        return int(main(args) or 0)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - a crash is what the table looks for
        import traceback

        traceback.print_exc()
        return 1


def run_in_process(case: Case, work: Path) -> dict:
    """Run one case by calling its entry's ``main`` in this process, with file descriptors 1 and 2 captured (so
    whatever anything prints, logging handlers included, is seen as a user would see it). Also records the heavy
    modules this case imported (``heavy``) and this process's peak resident memory so far (``peak_mb``: a running
    maximum, so a bound on it holds for every case run before)."""
    import resource
    import tempfile

    from stapo.core import limits

    _prepare(case, work)
    main = _entry_main(case.entry)
    before = {m.split(".")[0] for m in sys.modules}
    saved_caps = {name: getattr(limits, name) for name, _ in case.caps}
    for name, value in case.caps:
        setattr(limits, name, value)
    args = [a.format(work=work) for a in case.args]
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            open(out.fileno(), "w", closefd=False) as py_out, open(err.fileno(), "w", closefd=False) as py_err:
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(out.fileno(), 1), os.dup2(err.fileno(), 2)
        start = time.monotonic()
        try:  # Python's writes through sys.std* (whatever they are now), the rest through the descriptors
            with contextlib.redirect_stdout(py_out), contextlib.redirect_stderr(py_err):
                rc = _call(main, args)
            seconds = time.monotonic() - start
        finally:
            py_out.flush(), py_err.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            os.close(saved[0]), os.close(saved[1])
            for name, value in saved_caps.items():
                setattr(limits, name, value)
        texts = []
        for f in (out, err):
            f.seek(0)
            texts.append(f.read().decode("utf-8", "replace"))
    heavy = sorted({m.split(".")[0] for m in sys.modules} - before & set(HEAVY_MODULES))
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return _result(case, work, rc, texts[0], texts[1], seconds, peak_mb, heavy)


def run_batch(work: Path, cases: list[Case] | None = None) -> list[dict]:
    """Every in-process case (``IN_PROCESS`` entries) in a fresh process of its own, one after the other: one
    interpreter start for ~75 cases instead of one each. Returns their results in order."""
    import tempfile

    names = [c.name for c in cases or CASES if c.entry in IN_PROCESS]
    with tempfile.NamedTemporaryFile(prefix="stapo-bad-inputs-", suffix=".json") as out:
        # started through _run_measured's small parent: its peak memory counts from there, not from the caller's
        rc, _, stderr, _ = _run_measured([sys.executable, __file__, "--in-process", "--work", str(work), "--json",
                                          out.name, "--names", json.dumps(names)], REPO, timeout=600)
        if rc not in (0, 1):
            raise RuntimeError(f"the in-process batch crashed (rc {rc}):\n{stderr[-3000:]}")
        return json.loads(Path(out.name).read_text())


# Linux keeps a process's peak RSS across exec, and a child spawned from a big process (pytest with torch loaded)
# starts from that parent's: a small Python process spawns the command and reaps it with wait4 instead.
MEASURE = """import os, subprocess, sys
proc = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(proc.pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def _run_measured(cmd: list[str], cwd: Path, timeout: float) -> tuple[int, str, str, int]:
    """(rc, stdout, stderr, peak resident KB) of one command (its process alone, not its children)."""
    import tempfile

    with tempfile.NamedTemporaryFile(prefix="stapo-peak-") as peak:
        res = subprocess.run([sys.executable, "-c", MEASURE, peak.name, *cmd], cwd=cwd, env=env(),
                             capture_output=True, text=True, timeout=timeout)
        kb = int(Path(peak.name).read_text() or 0)
    return res.returncode, res.stdout, res.stderr, kb


def ok(result: dict, case: Case | None = None) -> bool:
    bounded = case is None or not case.bounded or (result["peak_mb"] <= MAX_PEAK_MB and not result["wrote"])
    return (result["rc"] != 0 and len(result["lines"]) == 1 and not result["missing"] and not result["traceback"]
            and bounded and not result.get("heavy"))


class Holders:
    """The background processes that hold the locks of the 'in use' cases."""

    def __init__(self, work: Path):
        live = work / "live_scores" / "m" / "stapo" / "final" / "arith" / "t1.0_p1.0.jsonl"
        self.procs = [hold_in_background("run_lock", work / "busy"),
                      hold_in_background("output_lock", work / "busy_eval" / "aime24.jsonl"),
                      hold_in_background("run_lock", work / "live_runs" / "m" / "stapo"),
                      hold_in_background("output_lock", live)]

    def close(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGKILL)
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run the cases whose name contains this")
    parser.add_argument("--work", default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--in-process", action="store_true",
                        help="call each stapo / vllm_settings case's main() in this one process (fds 1 and 2 "
                             "captured) instead of starting a process per case; snakemake cases are left out")
    parser.add_argument("--names", help=argparse.SUPPRESS)  # JSON list of case names (run_batch)
    args = parser.parse_args(argv)
    import tempfile

    work = Path(args.work or tempfile.mkdtemp(prefix="stapo-bad-inputs-"))
    chosen = [c for c in CASES if (not args.only or args.only in c.name)
              and (not args.names or c.name in json.loads(args.names))
              and (not args.in_process or c.entry in IN_PROCESS)]
    if not args.names:  # run_batch's caller made the fixtures (and holds the locks)
        make_fixtures(work)
        holders = Holders(work)
    before = checksums(canary(work))
    try:
        if args.in_process:
            os.chdir(REPO)
            os.environ.update(env())
            results = [run_in_process(c, work) for c in chosen]
        else:
            results = [run_case(c, work) for c in chosen]
    finally:
        if not args.names:
            holders.close()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    after = checksums(canary(work))
    print(f"canary tree outside {work}: {len(before)} files, " + ("unchanged" if after == before else "CHANGED"))
    return _print_table(results) or int(after != before)


def _print_table(results: list[dict]) -> int:
    cases = {c.name: c for c in CASES}
    for r in results:
        flag = "ok  " if ok(r, cases[r["name"]]) else "FAIL"
        print(f"{flag} rc={r['rc']} {r['seconds']:5.2f}s {r['peak_mb']:4.0f} MB  {r['name']:<52} "
              f"{(r['lines'] or [''])[-1][:150]}")
    good = sum(ok(r, cases[r["name"]]) for r in results)
    slowest = max(results, key=lambda r: r["seconds"])
    print(f"\n{good}/{len(results)} one line naming the culprit, rc != 0, no traceback; slowest "
          f"{slowest['seconds']:.2f} s ({slowest['name']}); {sum(r['seconds'] <= TARGET_S for r in results)}/"
          f"{len(results)} within {TARGET_S:.0f} s; total {sum(r['seconds'] for r in results):.1f} s")
    return 0 if good == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
