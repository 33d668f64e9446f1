"""Bad study configs: each fails before any model loads, with one line naming the culprit, through both
``stapo train`` (in-process, model loading forbidden) and ``snakemake -n`` (a subprocess on the repo's Snakefile)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from stapo import cli, study

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TINY = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text())
MODEL, METHOD = "smollm2-135m", "stapo"  # the pair `stapo train` is asked for (the miniature's model)


def _set(path: str, value):
    """An edit of the tiny study: set the dotted ``path`` (None deletes it)."""

    def edit(c):
        *parents, last = path.split(".")
        node = c
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(last)
        else:
            node[last] = value

    return edit


def _rename(section: str, new: str):
    return lambda c: c.update({new: c.pop(section)})


# (id, edit of configs/tiny.yaml, text the one-line message must contain)
BAD = [
    ("top-level-typo", _rename("train", "trian"), "trian"),
    ("top-level-extra", _set("stuy", "x"), "stuy"),
    ("section-not-mapping", _set("train", [1, 2]), "train"),
    ("model-unknown-key", _set(f"models.{MODEL}.gpu", 8), "gpu"),
    ("model-no-spec", _set(f"models.{MODEL}.spec", None), "spec"),
    ("model-unknown-bundled", _set(f"models.{MODEL}.spec", "bundled:gpt5"), "bundled:gpt5"),
    ("model-bad-path", _set(f"models.{MODEL}.spec", "./no/such/model"), "./no/such/model"),
    ("model-train-override", _set(f"models.{MODEL}.train", {"num_generations": 0}), "num_generations"),
    ("objective-unknown", _set(f"methods.{METHOD}.objective", "ppo"), "ppo"),
    ("method-unknown-key", _set(f"methods.{METHOD}.tau", 0.1), "tau"),
    ("tau_p-range", _set(f"methods.{METHOD}.tau_p", 1.5), "tau_p"),
    ("quantile-range", _set(f"methods.{METHOD}.entropy_quantile", 0.0), "entropy_quantile"),
    ("method-named-base", _set("methods.base", {"objective": "justrl"}), "base"),
    ("train-unknown-key", _set("train.learning_rat", 1e-6), "learning_rat"),
    ("max_steps-negative", _set("train.max_steps", -1), "train.max_steps"),
    ("max_steps-string", _set("train.max_steps", "four"), "train.max_steps"),
    ("reward-unknown", _set("train.reward", "exact"), "train.reward"),
    ("dataset-missing-file", _set("train.dataset", {"path": "/no/such/train.jsonl"}), "/no/such/train.jsonl"),
    ("dataset-unknown", _set("train.dataset", {"name": "gsm9k"}), "gsm9k"),
    ("ppg-not-multiple", _set("train.prompts_per_generation", 5), "train.prompts_per_generation"),
    ("rollout-not-multiple", _set("train.prompts_per_generation", 3), "prompts_per_generation"),
    ("micro-batch-split", _set("train.per_device_train_batch_size", 3), "per_device_train_batch_size"),
    ("top_p-range", _set("train.top_p", 1.5), "top_p"),
    ("learning_rate-zero", _set("train.learning_rate", 0.0), "learning_rate"),
    ("eval-setting-name", lambda c: c["eval"]["settings"].update({"t1.0_p0.95": {"temperature": 1.0, "top_p": 0.95}}),
     "t1.0_p0.95"),
    ("eval-backend", _set("eval.backend", "tgi"), "tgi"),
    ("workflow-typo", _set("workflow.eval_bse", True), "eval_bse"),
]


# run on every `make test-fast`; the whole list runs with the slow tests (~10 s per Snakemake parse on 2 cores)
FAST = ("top-level-typo", "model-unknown-bundled", "max_steps-negative", "micro-batch-split")
BAD_SNAKEMAKE = [pytest.param(*b, id=b[0], marks=() if b[0] in FAST else pytest.mark.slow) for b in BAD]


def bad_file(tmp_path: Path, edit) -> Path:
    config = copy.deepcopy(TINY)
    edit(config)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model (or building the trainer) fails the test: the error must come first."""
    import stapo.models
    import stapo.trainer

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the config error")

    monkeypatch.setattr(stapo.trainer, "build_trainer", refuse)
    monkeypatch.setattr(stapo.trainer, "resolve_model", refuse)
    monkeypatch.setattr(stapo.models, "resolve_model", refuse)


@pytest.mark.parametrize("name, edit, culprit", BAD, ids=[b[0] for b in BAD])
def test_stapo_train_rejects_bad_config_in_one_line(tmp_path, capsys, no_model, name, edit, culprit):
    path = bad_file(tmp_path, edit)
    rc = cli.main(["train", "--recipe", str(path), "--model", MODEL, "--method", METHOD,
                   "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"stapo train: error: {path}") and culprit in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name, edit, culprit", BAD_SNAKEMAKE)
def test_snakemake_dry_run_rejects_the_same_configs(tmp_path, name, edit, culprit):
    path = bad_file(tmp_path, edit)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "HF_HUB_OFFLINE": "1"}
    res = subprocess.run([str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "-d", str(tmp_path), "-n",
                          "--configfile", str(path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    err = res.stderr.strip()
    assert res.returncode != 0
    last = err.splitlines()[-1]
    assert last.startswith("stapo config error: config (") and str(path) in last and culprit in last, err[-2000:]
    assert "Traceback" not in err and "Building DAG" not in res.stdout + err
    assert not (tmp_path / "results").exists()


def test_yaml_syntax_error_names_file_and_line(tmp_path, capsys):
    path = tmp_path / "broken.yaml"
    text = (REPO / "configs" / "tiny.yaml").read_text().replace("  max_steps: 4", "  max_steps: [4", 1)
    path.write_text(text)
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "max_steps: [4" in s)
    rc = cli.main(["train", "--recipe", str(path), "--model", MODEL, "--method", METHOD, "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    # the parser notices the unclosed "[" on the next line
    assert err.startswith(f"stapo train: error: {path}:{line + 1}:") and "YAML syntax error" in err, err


def test_missing_recipe_file(tmp_path, capsys):
    rc = cli.main(["train", "--recipe", str(tmp_path / "nope.yaml"), "--model", MODEL, "--method", METHOD,
                   "--out", str(tmp_path)])
    assert rc == 2 and capsys.readouterr().err.strip() == f"stapo train: error: {tmp_path / 'nope.yaml'}: file not found"


def test_debug_env_shows_the_traceback(tmp_path, monkeypatch):
    path = bad_file(tmp_path, _rename("train", "trian"))
    monkeypatch.setenv("STAPO_DEBUG", "1")
    with pytest.raises(study.StudyError, match="trian: unknown key"):
        cli.main(["train", "--recipe", str(path), "--model", MODEL, "--method", METHOD, "--out", str(tmp_path)])


def test_shipped_studies_pass_both_layers():
    for name in ("paper.yaml", "tiny.yaml"):
        config = study.load(REPO / "configs" / name)
        study.check_schema(config, source=name)
        study.check_plans(config, list(config["models"]), list(config["methods"]), source=name)
