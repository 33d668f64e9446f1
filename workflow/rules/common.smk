# Config checks and the helpers the rules use (functions only: rules live in the other .smk files).
import hashlib
import re
import sys
from pathlib import Path
import json

import yaml
from snakemake.utils import validate

from stapo.atomic import atomic_write
from stapo.report import FIGURE_KINDS
from stapo.schedule import optimizer_steps_per_rollout
from stapo.study import StudyError, check_plans, check_schema

# The config files that make the study: with --configfile, the first is the study and later ones overlay it
# (Snakefile); without, configs/paper.yaml. Named in every config error.
SOURCE = "config (" + (", ".join(map(str, workflow.overwrite_configfiles)) or "configs/paper.yaml") + ")"


def config_error(err):
    """One line on stderr and exit status 1: the bad key, not a schema dump or a traceback."""
    sys.exit(f"stapo config error: {err}")


try:
    check_schema(config, source=SOURCE)
except StudyError as err:
    config_error(err)
validate(config, workflow.source_path("../schemas/config.schema.yaml"), set_default=True)  # fills defaults

WF = config.setdefault("workflow", {})
MODELS = WF.get("models") or list(config["models"])
for _key in MODELS:
    if _key not in config["models"]:
        config_error(f"{SOURCE}: workflow.models: {_key!r} is not a key of models ({', '.join(config['models'])})")
METHODS = list(config["methods"])
try:  # what `stapo train` checks for each job (train section, method parameters, model specs), before any job
    check_plans(config, MODELS, METHODS, source=SOURCE)
except StudyError as err:
    config_error(err)
SETTINGS = list(config["eval"]["settings"])
BASE = "base"  # method and checkpoint key of the untrained model
REAL_BENCHMARKS = ("aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench")

# Each job's --recipe is a content-addressed file holding exactly the config sections the job reads, written by a
# job (study.smk), never on parse. A later dry run or run with another config plans other files and cannot change
# the config of a job already planned, and a job reruns exactly when its sections change (its input's name does).
RECIPES = {}  # results/recipes/<digest>.yaml -> its text
STUDY_FILE = "results/study.yaml"  # the whole resolved config, read by the report (written by study.smk)


def recipe_file(sections):
    text = yaml.safe_dump(json.loads(json.dumps(sections)), sort_keys=False)
    path = f"results/recipes/{hashlib.sha256(text.encode()).hexdigest()[:16]}.yaml"
    RECIPES[path] = text
    return path


def train_recipe_of(model, method):
    """models.<model> (spec and per-model train overrides: not resources), methods.<method>, train."""
    entry = config["models"][model]
    return recipe_file({"models": {model: {k: entry[k] for k in ("spec", "train") if k in entry}},
                        "methods": {method: config["methods"][method]}, "train": config["train"]})


def eval_recipe_of(benchmark, setting):
    """The eval section's options with this benchmark's and this setting's entries only."""
    ev = config["eval"]
    section = {k: v for k, v in ev.items() if k not in ("benchmarks", "settings")}
    section["benchmarks"] = {benchmark: ev["benchmarks"].get(benchmark, {})}
    section["settings"] = {setting: ev["settings"][setting]}
    return recipe_file({"eval": section})


def train_recipe(wildcards):
    return train_recipe_of(wildcards.model, wildcards.method)


def eval_recipe(wildcards):
    return eval_recipe_of(wildcards.benchmark, wildcards.setting)


STUDY_RECIPE = recipe_file(config)


def benchmarks():
    """Benchmarks of the study; real ones are dropped when the miniature has no local data dir."""
    names = list(config["eval"]["benchmarks"])
    if WF.get("real_benchmarks_need_data_dir") and not config["eval"].get("data_dir"):
        names = [b for b in names if b not in REAL_BENCHMARKS]
    return names


def curve_checkpoints(model):
    """Checkpoints at rollout steps eval_every, 2 eval_every, ... < train.max_steps (final is the curve's last
    point). Both count rollout steps (the paper's unit); checkpoint-<N> is named by TRL's optimiser step N = k × that
    (stapo.schedule)."""
    every = WF.get("eval_every")
    if not every:
        return []
    train = {**config["train"], **(config["models"][model].get("train") or {})}
    k = optimizer_steps_per_rollout(train)
    if every % int(train.get("save_steps", 1)):
        raise ValueError(f"workflow.eval_every ({every}) must be a multiple of train.save_steps "
                         f"({train.get('save_steps')}): only saved checkpoints can be evaluated")
    return [f"checkpoint-{n * k}" for n in range(every, int(train["max_steps"]), every)]


def score_file(model, method, ckpt, benchmark, setting):
    return f"scores/{model}/{method}/{ckpt}/{benchmark}/{setting}.summary.json"


def all_summaries():
    """One summary per (model, method, checkpoint, benchmark, setting) evaluation job of the study."""
    full = WF.get("checkpoints", ["final"])
    curve_bench = WF.get("curve_benchmark", "aime24")
    curve_settings = WF.get("curve_settings") or SETTINGS
    files = []
    for model in MODELS:
        runs = [(method, ckpt) for method in METHODS for ckpt in full]
        runs += [(BASE, BASE)] if WF.get("eval_base", True) else []
        for method, ckpt in runs:
            files += [score_file(model, method, ckpt, b, s) for b in benchmarks() for s in SETTINGS]
        if curve_bench in benchmarks():
            for method in METHODS:
                files += [score_file(model, method, c, curve_bench, s)
                          for c in curve_checkpoints(model) if c not in full for s in curve_settings]
    return files


def all_final_dirs():
    return [f"runs/{model}/{method}/final" for model in MODELS for method in METHODS]


def figure_files(ext):
    return [f"results/figures/{model}_{kind}.{ext}" for model in MODELS for kind in FIGURE_KINDS]


def model_opt(model, key):
    """Per-model setting (models.<model>.<key>), else the workflow-wide one (schema defaults fill it)."""
    return config["models"][model].get(key, WF[key])


def train_gpus(wildcards):
    return int(config["models"][wildcards.model].get("gpus", 0))


def eval_gpus(wildcards):
    entry = config["models"][wildcards.model]
    return int(entry.get("eval_gpus", 1 if entry.get("gpus", 0) > 0 else 0))


def train_launcher(wildcards):
    """`stapo` on one device; `accelerate launch` (the model's DeepSpeed config) on several GPUs."""
    gpus = train_gpus(wildcards)
    accel = config["models"][wildcards.model].get("accelerate_config")
    if gpus <= 1:
        return "stapo"
    if not accel:
        raise ValueError(f"models.{wildcards.model}.accelerate_config: required when gpus = {gpus} > 1")
    return f"accelerate launch --config_file {accel} --num_processes {gpus} -m stapo.cli"


def eval_model_input(wildcards):
    """Evaluations of trained checkpoints wait for training to finish (final/ exists)."""
    if wildcards.ckpt == BASE:
        return []
    return f"runs/{wildcards.model}/{wildcards.method}/final"


def eval_model_arg(wildcards):
    if wildcards.ckpt == BASE:
        return config["models"][wildcards.model]["spec"]
    return f"runs/{wildcards.model}/{wildcards.method}/{wildcards.ckpt}"


def eval_options(wildcards):
    """CLI flags of one `stapo eval` call, from the eval section (explicit, so each job's command says it all)."""
    ev = config["eval"]
    bench = ev["benchmarks"][wildcards.benchmark]
    opts = {
        "--backend": ev.get("backend"),
        "--samples": bench.get("samples"),
        "--limit": bench.get("limit", ev.get("limit")),
        "--max-new-tokens": bench.get("max_new_tokens", ev.get("max_new_tokens")),
        "--data-dir": ev.get("data_dir"),
    }
    return " ".join(f"{k} {v}" for k, v in opts.items() if v is not None)


for _model in MODELS:
    for _method in METHODS:
        train_recipe_of(_model, _method)
for _bench in config["eval"]["benchmarks"]:
    for _setting in SETTINGS:
        eval_recipe_of(_bench, _setting)
