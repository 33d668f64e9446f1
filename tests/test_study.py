"""Bad study configs: each fails before any model loads, with one line naming the culprit, through both
``stapo train`` (in-process, model loading forbidden) and ``snakemake -n`` on the repo's Snakefile (every case
through Snakemake's API, all in one process: tests/helpers/snakemake_batch.py; a few also through the command line,
for what it prints)."""

from __future__ import annotations

import copy
import csv
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from stapo import cli, study

from stapo.core import fields

from stapo.study import names
from stapo.models import PAPER_MODELS
from stapo.study.evaluation import BenchmarkEntry
from stapo.study.methods import METHODS
from stapo.tasks import registry

from helpers.snakemake_batch import dry_runs

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
    ("local-topk-needs-per-micro-batch", _set(f"methods.{METHOD}.quantile_scope", "micro_batch_local_topk"),
     "quantile_scope: micro_batch_local_topk"),
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
    ("method-train-bound", _set(f"methods.{METHOD}.train", {"prompts_per_step": 0}),
     f"methods.{METHOD}.train.prompts_per_step"),
    ("method-train-unknown-key", _set(f"methods.{METHOD}.train", {"micro_batch_token": 64}), "micro_batch_token"),
    ("method-train-not-mapping", _set(f"methods.{METHOD}.train", 4), f"methods.{METHOD}.train"),
    ("method-train-split", _set(f"methods.{METHOD}.train", {"per_device_train_batch_size": 3}),
     "per_device_train_batch_size"),
    ("budget-below-longest", _set("train.micro_batch_tokens", 100), "train.micro_batch_tokens"),
    ("budget-bound", _set("train.micro_batch_tokens", 10**9), "train.micro_batch_tokens"),
    ("padding-free-needs-budget", _set("train.padding_free", True), "train.padding_free"),
    ("mini-batch-unknown", _set("train.mini_batch", "prompts"), "train.mini_batch"),
    ("learning_rate-zero", _set("train.learning_rate", 0.0), "learning_rate"),
    ("eval-benchmark-no-file", lambda c: c["eval"]["benchmarks"].update({"gsm_tiny": {"samples": 2}}), "gsm_tiny"),
    ("eval-setting-no-top-p", lambda c: c["eval"]["settings"].update({"t0.6": {"temperature": 0.6}}), "t0.6"),
    ("curve-setting-unknown", _set("workflow.curve_settings", ["t0.6_p0.95"]), "t0.6_p0.95"),
    ("eval-backend", _set("eval.backend", "tgi"), "tgi"),
    ("workflow-typo", _set("workflow.eval_bse", True), "eval_bse"),
]


# also run through the snakemake command line (one process each, ~1.5 s): what the user sees printed
CLI = ("top-level-typo", "model-unknown-bundled", "max_steps-negative", "micro-batch-split")


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
    import stapo.train.trainer

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the config error")

    monkeypatch.setattr(stapo.train.trainer, "build_trainer", refuse)
    monkeypatch.setattr(stapo.train.trainer, "resolve_model", refuse)
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


@pytest.fixture(scope="module")
def snakemake_verdicts(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """Every BAD study's ``snakemake -n`` through the Snakefile, all in one process (Snakemake's API): by name,
    (the config file, how the run stopped)."""
    requests, paths = [], {}
    for name, edit, _ in BAD:
        tmp = tmp_path_factory.mktemp(name)
        paths[name] = bad_file(tmp, edit)
        requests.append({"name": name, "configfiles": [str(paths[name])], "workdir": str(tmp),
                         "targets": ["results/table.md"]})
    return {name: (paths[name], verdict) for name, verdict in dry_runs(requests).items()}


@pytest.mark.parametrize("name, edit, culprit", BAD, ids=[b[0] for b in BAD])
def test_snakemake_dry_run_rejects_the_same_configs(snakemake_verdicts, name, edit, culprit):
    path, verdict = snakemake_verdicts[name]
    assert verdict["error"] is None and verdict["exit"] is not None, verdict
    assert verdict["stage"] == "workflow", verdict  # while the Snakefile is parsed: before any DAG is built
    message = verdict["exit"]
    assert len(message.splitlines()) == 1, message
    assert message.startswith("stapo config error: config (") and str(path) in message and culprit in message, message
    assert not (path.parent / "results").exists()


def test_the_batch_tells_a_good_study_from_a_bad_one(tmp_path):
    """The API batch can fail the test above: the miniature itself plans its DAG to the end."""
    good = bad_file(tmp_path, lambda c: None)
    (verdict,) = dry_runs([{"name": "good", "configfiles": [str(good)], "workdir": str(tmp_path),
                            "targets": ["results/table.md"]}]).values()
    assert verdict == {"exit": None, "error": None, "stage": "done"}


@pytest.mark.parametrize("name, edit, culprit", [b for b in BAD if b[0] in CLI], ids=CLI)
def test_snakemake_command_prints_one_line_naming_the_culprit(tmp_path, name, edit, culprit):
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
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err == f"stapo train: error: {tmp_path / 'nope.yaml'}: file not found"


def test_debug_env_shows_the_traceback(tmp_path, monkeypatch):
    path = bad_file(tmp_path, _rename("train", "trian"))
    monkeypatch.setenv("STAPO_DEBUG", "1")
    with pytest.raises(study.StudyError, match="trian: unknown key"):
        cli.main(["train", "--recipe", str(path), "--model", MODEL, "--method", METHOD, "--out", str(tmp_path)])


def test_shipped_studies_parse():
    paper = study.read(REPO / "configs" / "paper.yaml")
    assert list(paper.methods) == list(names.MAIN_METHODS) and paper.workflow.eval_every == 20
    assert paper.plan("qwen3-14b-base", "stapo").settings.vllm_gpu_memory_utilization == 0.45  # model override
    assert paper.plan("qwen3-8b-base", "stapo").settings.vllm_gpu_memory_utilization == 0.5  # the train section
    assert paper.eval.samples("aime24") == 32 and paper.eval.samples("math500") == 4
    tiny = study.read(REPO / "configs" / "tiny.yaml")
    assert tiny.run_models == [MODEL] and tiny.workflow.real_benchmarks_need_data_dir is True


def test_train_errors_come_before_torch(tmp_path):
    """`stapo train` rejects a bad train value without importing torch (the whole study is checked first)."""
    path = bad_file(tmp_path, _set("train.max_steps", -1))
    code = (f"import sys; from stapo import cli; rc = cli.main(['train', '--recipe', {str(path)!r}, '--model', "
            f"{MODEL!r}, '--method', {METHOD!r}, '--out', {str(tmp_path / 'run')!r}]); "
            "print(rc, 'torch' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.stdout.split() == ["2", "False"], res.stdout + res.stderr
    assert "train.max_steps" in res.stderr


# -------------------------------------------------------------------- one model: schema, dataclasses, names


SCHEMA = yaml.safe_load(study.SCHEMA.read_text())


def _props(*path: str) -> set:
    node = SCHEMA
    for key in path:
        node = node["properties"][key] if key != "*" else node["additionalProperties"]
    return set(node["properties"])


def _fields(cls) -> set:
    return {f.name for f in dataclasses.fields(cls)}


def test_schema_keys_are_the_dataclass_fields():
    assert _props() == set(study.SECTIONS)
    assert _props("models", "*") == _fields(study.ModelEntry)
    assert _props("methods", "*") == _fields(study.ObjectiveConfig) - {"method"} | {"objective", "label", "train"}
    assert _props("eval") == _fields(study.EvalSection)
    assert _props("eval", "benchmarks", "*") == _fields(BenchmarkEntry)
    assert _props("workflow") == _fields(study.WorkflowSection)


def test_schema_names_are_the_declarations():
    props = study.study_schema()["properties"]
    objectives = props["methods"]["additionalProperties"]["properties"]["objective"]["enum"]
    assert objectives == list(METHODS) == list(study.OBJECTIVES) == [m for m in names.METHODS if m != names.BASE]
    assert props["methods"]["propertyNames"]["not"]["const"] == names.BASE
    assert list(names.BENCHMARKS) == list(registry.BENCHMARKS)
    assert {k: n.label for k, n in names.BENCHMARKS.items()} == {k: b.label for k, b in registry.BENCHMARKS.items()}
    assert set(names.SETTINGS) == set(registry.SETTINGS)
    assert set(names.MODELS) == set(PAPER_MODELS)


def test_paper_table_keys_are_in_the_registry():
    with open(REPO / "stapo" / "reference" / "paper_v2_table.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    for column, registry_ in (("model", names.MODELS), ("method", names.METHODS), ("setting", names.SETTINGS)):
        assert {r[column] for r in rows} == {n.paper for n in registry_.values() if n.paper}, column
    assert {r["benchmark"] for r in rows} - {"avg"} == set(names.PAPER_BENCHMARKS)


@pytest.mark.parametrize("cls", [study.ModelEntry, study.ObjectiveConfig, study.TrainSettings, study.EvalSection,
                                 BenchmarkEntry, study.WorkflowSection])
def test_every_field_is_documented(cls):
    """A field's documentation is its metadata (stapo.core.fields.option), and the schema's description is that text."""
    missing = [f.name for f in dataclasses.fields(cls) if f.name != "method" and len(f.metadata.get("help", "")) < 10]
    assert not missing, f"{cls.__name__}: undocumented fields {missing}"


def test_the_schema_is_generated_from_the_dataclasses():
    """The workflow catalog's schema file is the package's generated schema (regenerate: stapo schema --out ...);
    a field's type, enum and description reach it from the field's one declaration."""
    from stapo.study.schema import dump

    regenerate = "run: stapo schema --out workflow/schemas/config.schema.yaml"
    assert study.SCHEMA.read_text(encoding="utf-8") == dump(), regenerate
    schema = study.study_schema()
    train = schema["properties"]["train"]["properties"]
    assert train["micro_batch_tokens"]["type"] == ["integer", "null"]
    assert train["mini_batch"]["enum"] == ["groups", "shuffled"]
    assert "maximum" not in train["max_steps"]  # train_settings checks stapo.core.limits' bounds (one message)
    eval_ = schema["properties"]["eval"]["properties"]
    assert eval_["max_new_tokens"]["maximum"] == 131_072 and eval_["protocol"]["enum"] == ["justrl", "harness"]
    assert train["report_to"]["type"] == ["string", "array"]
    assert schema["properties"]["models"]["additionalProperties"]["properties"]["train"]["properties"] == train
    workflow = schema["properties"]["workflow"]["properties"]
    assert workflow["keep_checkpoints"] == {"type": "boolean", "description": fields.doc(study.WorkflowSection,
                                            "keep_checkpoints"), "default": True}


def test_eval_section_lists_what_the_study_evaluates():
    section = study.EvalSection.from_dict({"benchmarks": {"math500": {"limit": 3}}, "hf": {"batch_size": 2}})
    assert list(section.benchmarks) == ["math500"] and section.benchmark("math500").limit == 3
    assert section.samples("aime24") == 32  # not listed: the paper's N
    assert section.hf == {"batch_size": 2, "dtype": "float32"} and list(section.settings) == list(names.SETTINGS)
    with pytest.raises(ValueError, match="eval.benchmarks.math500.samples"):
        study.EvalSection.from_dict({"benchmarks": {"math500": {"samples": 0}}})


def test_a_number_left_a_string_by_snakemake_config_says_how_to_override():
    """snakemake --config 'workflow={seeds: [0,1,2]}' hands the study strings; the error says what to do instead."""
    config = copy.deepcopy(TINY)
    config["workflow"]["seeds"] = ["0", "1", "2"]
    with pytest.raises(study.StudyError, match=r"workflow.seeds.\d: '\d' is not of type 'integer'; snakemake --config "
                                               r"reads values nested in \{...\} as strings: .* second --configfile"):
        study.check_schema(config)
    config["workflow"]["seeds"] = ["zero"]  # a plain wrong value: no hint
    with pytest.raises(study.StudyError) as err:
        study.check_schema(config)
    assert "is not of type 'integer'" in str(err.value) and "snakemake --config" not in str(err.value)


def test_method_train_overrides_reach_only_that_method():
    """methods.<key>.train is the method's recipe: over train, under models.<key>.train, for that method only."""
    config = copy.deepcopy(TINY)
    config["methods"]["entropy20"]["train"] = {"prompts_per_generation": 4, "num_generations": 16,
                                               "max_completion_length": 32, "mini_batch": "groups"}
    config["models"][MODEL]["train"] = {"max_completion_length": 40}
    s = study.parse(config, check_runs=False)
    e20, stapo = s.plan(MODEL, "entropy20").settings, s.plan(MODEL, "stapo").settings
    assert (e20.prompts_per_generation, e20.num_generations, e20.mini_batch) == (4, 16, "groups")
    assert e20.max_completion_length == 40 == stapo.max_completion_length  # the model's hardware override wins
    assert (stapo.prompts_per_generation, stapo.num_generations, stapo.mini_batch) == (2, 8, "shuffled")
    assert s.train_overrides() == {"entropy20": config["methods"]["entropy20"]["train"]}
    assert "train" not in dataclasses.asdict(s.methods["entropy20"])  # not an objective parameter
    # the optimiser steps per rollout step differ, so do the curve checkpoints' names (k = 4 / 2 = 2 vs 1)
    config["workflow"].update(eval_every=2)
    config["train"].update(max_steps=6, save_total_limit=None)
    s = study.parse(config)
    assert study.curve_checkpoints(s, MODEL, "entropy20") == ["checkpoint-4", "checkpoint-8"]
    assert study.curve_checkpoints(s, MODEL, "stapo") == ["checkpoint-2", "checkpoint-4"]


def test_token_budget_and_whole_groups_map_onto_trl():
    from stapo.study.train import trl_micro_batch

    s = study.train_settings({"micro_batch_tokens": 32768, "mini_batch": "groups"})
    assert study.accumulation(s, 8) == (1, 4) and trl_micro_batch(s, 8) == 64  # TRL: each process's whole step
    assert study.accumulation(study.train_settings({}), 8) == (64, 256)  # fixed micro-batch 1, as before
    with pytest.raises(ValueError, match="multiple of the processes"):  # whole groups per process: 32 over 64
        study.accumulation(study.train_settings({"mini_batch": "groups", "prompts_per_step": 32,
                                                 "balance_batch": False}), 64)
    # balanced (verl): each process's share is its partition, 256 completions per step = 4 per process
    assert study.accumulation(study.train_settings({"mini_batch": "groups", "prompts_per_step": 32}), 64) == (4, 32)
