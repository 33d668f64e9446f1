"""Run integrity IV, end to end: a symbolic link planted at every file name a real ``stapo train`` and a real
``stapo eval`` write is refused in one line naming it, and the tree the link points into is unchanged.

The names are not a list kept here: a real (one-step, tiny-qwen3) training run and a real (one problem, one
sample) evaluation are made first, and every entry they leave in their directories is then planted as a link,
one at a time, in a fresh directory. The refusals come before any model loads (the CLI's checks), so each is a
call of ``stapo.cli.main`` in this process. The cases of benchmarks/bench_bad_inputs.py cover the same names
in the fast tier (tests/test_bad_inputs.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stapo.cli import main

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ["train", "--recipe", str(ROOT / "configs" / "tiny.yaml"), "--model", "tiny-qwen3", "--method", "stapo",
         "--max-steps", "1"]
EVAL = ["eval", "--model", "bundled:tiny-qwen3", "--benchmark", "arith", "--setting", "t1.0_p1.0", "--recipe",
        str(ROOT / "configs" / "tiny.yaml"), "--limit", "1", "--samples", "1", "--max-new-tokens", "4",
        "--backend", "hf"]


def _run(args: list[str], cwd: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    res = subprocess.run([sys.executable, "-m", "stapo.cli", *args], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]


def _refused(args: list[str], link: Path, capsys) -> None:
    assert main(args) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and f"{link} is a symbolic link" in lines[0], lines


@pytest.mark.slow
def test_a_link_at_every_file_a_real_run_writes_is_refused(tmp_path, capsys):
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "v").write_text("keep\n")
    _run([*TRAIN, "--out", str(tmp_path / "run")], tmp_path)
    _run([*EVAL, "--out", str(tmp_path / "scores" / "arith.jsonl")], tmp_path)
    written = {"train": sorted(p.name for p in (tmp_path / "run").iterdir()),
               "eval": sorted(p.name for p in (tmp_path / "scores").iterdir())}
    with capsys.disabled():
        print("files written:", written)
    assert {"stapo.lock", "config.yaml", "metrics.jsonl", "final"} <= set(written["train"])
    assert {"arith.jsonl", "arith.summary.json", "arith.jsonl.lock", "arith.jsonl.cache.sqlite"} <= set(
        written["eval"])
    for name in written["train"]:
        out = tmp_path / "links" / "train" / name
        out.mkdir(parents=True)
        (out / name).symlink_to(canary / "v")
        _refused([*TRAIN, "--out", str(out)], out / name, capsys)
    for name in written["eval"]:
        out = tmp_path / "links" / "eval" / name
        out.mkdir(parents=True)
        (out / name).symlink_to(canary / "v")
        _refused([*EVAL, "--out", str(out / "arith.jsonl")], out / name, capsys)
    assert [p.name for p in canary.iterdir()] == ["v"] and (canary / "v").read_text() == "keep\n"
