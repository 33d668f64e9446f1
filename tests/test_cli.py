"""stapo.cli: an entry point that needs what this machine lacks (vLLM, a GPU, a model that is not there) says so in
one line with the fix, exit status 2, before the run directory or the evaluation output's lock exists (issue 42:
`stapo train --recipe configs/paper.yaml ...` without vLLM ended in a 24-line traceback and left a stapo.lock)."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest
import yaml

from stapo import cli

REPO = Path(__file__).resolve().parents[1]
PAPER = REPO / "configs" / "paper.yaml"
REAL_FIND_SPEC = importlib.util.find_spec


@pytest.fixture
def no_vllm(monkeypatch):
    """This machine without vLLM, whatever the test environment has."""
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == "vllm" else REAL_FIND_SPEC(name, *a, **k))


def _paper(tmp_path: Path, **train) -> Path:
    config = yaml.safe_load(PAPER.read_text(encoding="utf-8"))
    config["train"].update(train)
    path = tmp_path / "paper.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def _one_line(argv: list[str], capsys) -> str:
    t0 = time.monotonic()
    rc = cli.main(argv)
    seconds = time.monotonic() - t0
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert seconds < 20, seconds  # no model, no TRL: a torch import at most
    return err.strip()


def test_train_without_vllm_is_one_line_and_leaves_no_lock(tmp_path, no_vllm, capsys):
    out = tmp_path / "runs" / "qwen3-8b-base" / "stapo"
    line = _one_line(["train", "--recipe", str(PAPER), "--model", "qwen3-8b-base", "--method", "stapo", "--out",
                      str(out)], capsys)
    assert line.startswith(f"stapo train: error: {PAPER}: train.use_vllm: true needs vLLM, which is not installed")
    assert "conda env create -f environment.yml" in line and "train.use_vllm: false" in line
    assert "--recipe configs/tiny.yaml" in line  # the CPU miniature, as the fix on a CPU
    assert not out.exists()  # no run directory, no stapo.lock


def test_train_for_gpus_on_a_machine_without_one(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "_torch_sees_a_gpu", lambda: False)
    out = tmp_path / "run"
    line = _one_line(["train", "--recipe", str(_paper(tmp_path, use_vllm=False)), "--model", "qwen3-1.7b-base",
                      "--method", "justrl", "--out", str(out)], capsys)
    assert "models.qwen3-1.7b-base.gpus = 8, but this machine has no GPU" in line and "configs/tiny.yaml" in line
    assert not out.exists()


def test_a_multi_process_launch_of_a_gpu_model_chose_its_devices_itself(tmp_path, monkeypatch, capsys):
    """Under accelerate launch / torchrun (WORLD_SIZE > 1) the GPU check stands aside: the launch may run CPU ranks
    (gloo), as the SLURM continuation test does with gpus: 2. The next need (a hub model not cached) still speaks."""
    monkeypatch.setattr(cli, "_torch_sees_a_gpu", lambda: False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    out = tmp_path / "run"
    line = _one_line(["train", "--recipe", str(_paper(tmp_path, use_vllm=False)), "--model", "qwen3-1.7b-base",
                      "--method", "justrl", "--out", str(out)], capsys)
    assert "no GPU" not in line and "is not in the local Hugging Face cache" in line
    assert not out.exists()


def test_train_of_a_hub_model_that_is_not_cached_while_offline(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    monkeypatch.setattr(cli, "_torch_sees_a_gpu", lambda: True)
    out = tmp_path / "run"
    line = _one_line(["train", "--recipe", str(_paper(tmp_path, use_vllm=False)), "--model", "qwen3-1.7b-base",
                      "--method", "justrl", "--out", str(out)], capsys)
    assert "models.qwen3-1.7b-base.spec: Qwen/Qwen3-1.7B-Base is not in the local Hugging Face cache" in line
    assert "huggingface-cli download Qwen/Qwen3-1.7B-Base" in line
    assert not out.exists()


@pytest.mark.parametrize("model, expect", [
    ("bundled:smollm2-135m-instruct", "backend vllm: the vllm package is not installed; use --backend hf"),
    ("Qwen/Qwen3-8B-Base", "--model: Qwen/Qwen3-8B-Base is not in the local Hugging Face cache"),
])
def test_eval_that_cannot_run_here_leaves_no_lock(tmp_path, monkeypatch, no_vllm, capsys, model, expect):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    out = tmp_path / "scores" / "x.jsonl"
    line = _one_line(["eval", "--model", model, "--benchmark", "arith", "--setting", "t1.0_p1.0", "--out", str(out),
                      "--backend", "vllm", "--samples", "1", "--max-new-tokens", "8"], capsys)
    assert expect in line, line
    assert not list(out.parent.glob("*.lock")) and not out.exists()
