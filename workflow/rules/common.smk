# Config checks and the helpers the rules use (functions only: rules live in the other .smk files).
import hashlib
import os
import re
import shlex
import signal
import sys
import threading
from pathlib import Path
import json

import yaml

from stapo.core.atomic import atomic_write
from stapo.study.names import BASE
from stapo.core import driver as stapo_driver
from stapo.core import launch as stapo_launch
from stapo.core import leave as stapo_leave
from stapo import study as stapo_study  # not `parse` itself: the Snakefile namespace has its own

def config_error(err):
    """One line on stderr and exit status 1: the bad key, not a schema dump or a traceback."""
    sys.exit(f"stapo config error: {err}")


def study_files():
    """The files of ``--config study_file=FILE`` (or ``[FILE,OVERLAY,...]``), or [] without it."""
    files = config.get("study_file")
    if files is None:
        return []
    if workflow.overwrite_configfiles:
        config_error("give the study once: --config study_file=FILE or --configfile FILE, not both")
    return [files] if isinstance(files, str) else files


def load_study_files(files):
    """``config`` becomes the study of ``files`` (stapo.study.load_files: each raw file read bounded, nesting
    and duplicate keys refused), with any other ``--config`` key=value over it, as Snakemake would lay them."""
    overrides = {k: v for k, v in config.items() if k != "study_file"}
    try:
        study = stapo_study.load_files(files)
    except stapo_study.StudyError as err:
        config_error(err)
    config.clear()
    config.update(stapo_study.overlay(study, overrides))


# The config files that make the study: --config study_file=... (read here), else --configfile's (the first is the
# study, later ones overlay it: Snakefile), else configs/paper.yaml. Named in every config error.
STUDY_FILES = study_files()
if STUDY_FILES:
    load_study_files(STUDY_FILES)
SOURCE = "config (" + (", ".join(map(str, STUDY_FILES or workflow.overwrite_configfiles)) or PAPER_STUDY) + ")"


def check_profile_variables():
    """A profile's ``${VAR}`` whose variable is unset or empty stops the run with one line, before any job is
    submitted (Snakemake keeps an unset variable as written: sbatch would get the literal ``${STAPO_SLURM_...}``)."""
    defaults = workflow.resource_settings.default_resources
    for arg in getattr(defaults, "args", None) or []:
        for var in re.findall(r"\$\{(\w+)\}|\$(\w+)", arg):
            name = var[0] or var[1]
            if not os.environ.get(name):
                key = arg.split("=", 1)[0]
                sys.exit(f"stapo profile error: {name} is not set: export {name}=<value> (default resource {key})")


check_profile_variables()

# Inside a SLURM job, a training job's step gets SIGUSR1 ahead of its wall-time limit (train_slurm_extra). It is meant
# for `stapo train`, which installs its own handler (stapo.train.continuation); this Snakemake process (under the
# SLURM executor, the one that runs the rule inside the job step) and the shell and launcher it starts ignore it
# (an ignored signal stays ignored across exec) instead of dying of it.
if os.environ.get("SLURM_JOB_ID") and threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)

# Every job's `stapo` watches this process (the driver, or the SLURM job step that runs the job: it parses this
# file again) and stops when it is gone, instead of training on orphaned (stapo.core.driver).
os.environ[stapo_driver.ENV] = stapo_driver.identity()

try:  # the whole study, as `stapo train` / `stapo eval` check it (stapo.study.parse), before any job
    STUDY = stapo_study.parse(config, source=SOURCE)
except stapo_study.StudyError as err:
    config_error(err)
WF = STUDY.workflow
MODELS = STUDY.run_models
METHODS = list(STUDY.methods)
# A run is one (method, seed): its name is the method key with one seed, `<method>/seed<k>` with several
# (workflow.seeds); runs/<model>/<run>/ and scores/<model>/<run>/ keep the one-run layout for one seed.
RUNS = {run: (method, seed) for method in METHODS for run, seed in STUDY.runs(method).items()}
MULTI_NODE = [m for m in MODELS if STUDY.models[m].nodes > 1]  # trained by rule train_nodes (train.smk)
SETTINGS = list(STUDY.eval.settings)


def check_contained():
    """Every directory a job writes stays under runs/ or scores/ (the schema's key patterns already refuse `..`;
    this holds whatever a later pattern admits)."""
    for root in ("runs", "scores"):
        base = Path(root).resolve()
        for model in MODELS:
            for run in [*RUNS, BASE]:
                for setting in SETTINGS:
                    path = Path(root, model, run, BASE, setting).resolve()
                    if not path.is_relative_to(base):
                        config_error(f"{SOURCE}: models.{model} / run {run} / eval.settings.{setting}: "
                                     f"{root}/{model}/{run}/.../{setting} leaves {root}/")


check_contained()

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


def unlabelled(entry):
    """A config entry without its display ``label``: a new label changes no job's recipe (nothing reruns)."""
    return {k: v for k, v in (entry or {}).items() if k != "label"}


def train_recipe_of(model, method):
    """models.<model> (spec and per-model train overrides: not resources), methods.<method>, train; with the rollout
    steps whose evaluation snapshots the workflow reads (train.snapshot_steps: workflow.checkpoints, eval_every)."""
    entry = config["models"][model]
    train = {**config["train"], "snapshot_steps": stapo_study.snapshot_steps(STUDY, model, method)}
    return recipe_file({"models": {model: {k: entry[k] for k in ("spec", "train") if k in entry}},
                        "methods": {method: unlabelled(config["methods"][method])}, "train": train})


def eval_recipe_of(benchmark, setting):
    """The eval section's options with this benchmark's and this setting's entries only."""
    ev = config["eval"]
    section = {k: v for k, v in ev.items() if k not in ("benchmarks", "settings")}
    section["benchmarks"] = {benchmark: unlabelled(ev["benchmarks"].get(benchmark))}
    section["settings"] = {setting: unlabelled(ev["settings"][setting])}
    return recipe_file({"eval": section})


def train_recipe(wildcards):
    return train_recipe_of(wildcards.model, RUNS[wildcards.run][0])


def run_method(wildcards):
    return RUNS[wildcards.run][0]


def run_seed_option(wildcards):
    """`--seed k` when the study names its seeds (workflow.seeds); else none: the recipe's train.seed."""
    return f" --seed {RUNS[wildcards.run][1]}" if WF.seeds is not None else ""


def eval_recipe(wildcards):
    return eval_recipe_of(wildcards.benchmark, wildcards.setting)


STUDY_RECIPE = recipe_file(config)


def benchmarks():
    """Benchmarks of the study; those read from eval.data_dir are dropped when the miniature has none."""
    names = list(STUDY.eval.benchmarks)
    if WF.real_benchmarks_need_data_dir and not STUDY.eval.data_dir:
        names = [b for b in names if not STUDY.eval.uses_data_dir(b)]
    return names


def benchmark_input(wildcards):
    """A benchmark's own file (eval.benchmarks.<key>.file) is the job's input: editing it reruns the job."""
    file = STUDY.eval.benchmark(wildcards.benchmark).file
    return [file] if file else []


def score_file(model, run, ckpt, benchmark, setting):
    return f"scores/{model}/{run}/{ckpt}/{benchmark}/{setting}.summary.json"


def all_summaries():
    """One summary per (model, run, checkpoint, benchmark, setting) evaluation job of the study."""
    full = WF.checkpoints
    curve_bench = WF.curve_benchmark
    curve_settings = STUDY.curve_settings
    files = []
    for model in MODELS:
        runs = [(run, ckpt) for run in RUNS for ckpt in full]
        runs += [(BASE, BASE)] if WF.eval_base else []  # the untrained model: one evaluation for every seed
        for run, ckpt in runs:
            files += [score_file(model, run, ckpt, b, s) for b in benchmarks() for s in SETTINGS]
        if curve_bench in benchmarks():
            for run in RUNS:
                curve = stapo_study.curve_checkpoints(STUDY, model, RUNS[run][0])  # the run's method's recipe
                files += [score_file(model, run, c, curve_bench, s)
                          for c in curve if c not in full for s in curve_settings]
    return files


def all_final_dirs():
    return [f"runs/{model}/{run}/final" for model in MODELS for run in RUNS]


def model_opt(model, key):
    """Per-model resource (models.<model>.<key>), else the workflow-wide one."""
    value = getattr(STUDY.models[model], key)
    return getattr(WF, key) if value is None else value


def train_cpus(wildcards):
    """The job's threads, which the SLURM executor requests as --cpus-per-task (locally capped at --cores)."""
    return STUDY.models[wildcards.model].cpus("train", WF.threads)


def eval_cpus(wildcards):
    return STUDY.models[wildcards.model].cpus("eval", WF.threads)


def alternatives(names):
    """A wildcard constraint matching exactly ``names`` (none: a pattern that matches nothing)."""
    names = list(names)
    return "|".join(map(re.escape, names)) if names else "(?!)"


def one_node():
    """Whether this run executes jobs on the machine it was started on (no cluster executor: `--cores N` alone or
    the local profile). A model declared for several nodes then trains on this one node. A dry run (Snakemake's
    `dryrun` executor, whatever the profile) shows the cluster's job."""
    return getattr(workflow.executor_plugin, "name", None) == "local"


def train_topology(model):
    """(GPUs per node, nodes) of one training job as it runs here: the model's own, or its GPUs on one node when
    no cluster executor runs the jobs (:func:`one_node`); the first such job of a model says so in one line."""
    entry = STUDY.models[model]
    if entry.nodes == 1 or not one_node():
        return entry.gpus, entry.nodes
    if model not in ONE_NODE_SAID:
        ONE_NODE_SAID.add(model)
        print(one_node_line(model, entry), file=sys.stderr)
    return entry.gpus, 1


ONE_NODE_SAID = set()


def one_node_line(model, entry):
    """What a multi-node model does on one node: the same global batch, its processes' share by accumulation."""
    settings = STUDY.train_settings(model)
    try:
        more = (stapo_study.accumulation(settings, entry.gpus)[0]
                // stapo_study.accumulation(settings, entry.gpus * entry.nodes)[0])
        how = f"{more}x the gradient accumulation"
    except (ValueError, ZeroDivisionError):
        how = "more gradient accumulation"
    return (f"stapo: models.{model}.nodes = {entry.nodes}, but no cluster profile: it trains on this one node's "
            f"{entry.gpus} GPU(s) with the same global batch ({settings.prompts_per_step} prompts x "
            f"{settings.num_generations} rollouts per optimiser step), {how}; --profile workflow/profiles/slurm "
            f"runs it on {entry.nodes} nodes")


def train_gpus(wildcards):
    """GPUs of the whole training job, all nodes (the SLURM plugin's --gpus; the local profile's `gpu` budget)."""
    gpus, nodes = train_topology(wildcards.model)
    return gpus * nodes


def train_nodes(wildcards):
    return train_topology(wildcards.model)[1]


def eval_gpus(wildcards):
    return STUDY.models[wildcards.model].eval_devices


def train_launcher(wildcards):
    """`stapo` on one device; `accelerate launch` (its accelerate config: FSDP2 or DeepSpeed) on several GPUs; on
    several nodes srun + one `accelerate launch --num_machines N` per node (stapo.core.launch), under a cluster
    executor; without one, a multi-node model's job runs on this node (:func:`train_topology`)."""
    entry = STUDY.models[wildcards.model]
    gpus, nodes = train_topology(wildcards.model)
    config = repo_path(entry.accelerate_config) if entry.accelerate_config else None
    return stapo_launch.train_launcher(gpus, nodes, config)


def prune_checkpoints(wildcards):
    """With workflow.keep_checkpoints false, the shell tail that deletes the run's resume checkpoints (checkpoint-N/,
    each with its optimiser state) once final/ is written; else nothing. Evaluations read snapshots, not these."""
    if WF.keep_checkpoints:
        return ""
    run_dir = shlex.quote(f"runs/{wildcards.model}/{wildcards.run}")
    return f" && find {run_dir} -maxdepth 1 -name 'checkpoint-*' -exec rm -rf {{}} +"


def requeue_on_leave(wildcards):
    """Under SLURM: the shell tail that requeues the job when `stapo train` left at a rollout boundary on request
    (the marker runs/<model>/<run>/stapo.continue, stapo.core.leave; removed before each attempt), so the job of the
    same id reruns and continues the run; anything else stays a failure (the profile's retries). Elsewhere nothing:
    the job fails with exit status 75, rerun to continue. Snakemake starts each job with an empty log: the log of a
    job that left is kept as <log>.<k> (k = 1, 2, ...: the first free number; created anew under the rule's set -C,
    never through a link)."""
    if getattr(workflow.executor_plugin, "name", None) != "slurm" and not os.environ.get("SLURM_JOB_ID"):
        return ""
    mark = shlex.quote(f"runs/{wildcards.model}/{wildcards.run}/{stapo_leave.CONTINUE_MARK}")
    log = f"logs/train/{wildcards.model}/{wildcards.run}.log"
    q = shlex.quote(log)
    return (f' || {{ rc=$?; if [ -e {mark} ] && [ -n "${{SLURM_JOB_ID:-}}" ]; then'
            f' echo "stapo: requeueing SLURM job $SLURM_JOB_ID to continue the run" >> {q};'
            f' k=1; while [ -e {q}."$k" ]; do k=$((k + 1)); done; cat {q} > {q}."$k";'
            ' scontrol requeue "$SLURM_JOB_ID"; fi; exit "$rc"; }')


def train_slurm_extra(wildcards):
    """sbatch flags of a training job: requeueable, and SIGUSR1 workflow.train_leave_before seconds ahead of its
    wall-time limit (at most half of it), when it saves a checkpoint at its next rollout boundary and leaves."""
    runtime = model_opt(wildcards.model, "train_runtime")
    return f"--requeue --signal=USR1@{min(WF.train_leave_before, runtime * 30)}"


def repo_path(path):
    """A relative path of the study (configs/accelerate/...) as given when it exists from the working directory,
    else beside the Snakefile (a `-d DIR` run of the paper's study)."""
    if Path(path).is_absolute() or Path(path).exists():
        return path
    return str(Path(workflow.basedir) / path)


def eval_model_input(wildcards):
    """Evaluations of trained checkpoints wait for training to finish (final/ exists); a checkpoint-N is read from
    its evaluation snapshot (rule snapshot)."""
    if wildcards.ckpt == BASE:
        return []
    return eval_model_arg(wildcards)


def eval_model_arg(wildcards):
    if wildcards.ckpt == BASE:
        return STUDY.models[wildcards.model].spec
    if wildcards.ckpt == "final":
        return f"runs/{wildcards.model}/{wildcards.run}/final"
    return snapshot_dir(wildcards.model, wildcards.run, wildcards.ckpt)


def snapshot_output(pattern):
    """The snapshot rule's output: temp() unless the study keeps snapshots."""
    out = directory(pattern)
    return out if WF.keep_snapshots else temp(out)


def snapshot_dir(model, run, ckpt):
    """Where the workflow keeps the evaluation snapshot of checkpoint-N (a temp() output unless keep_snapshots)."""
    return f"snapshots/{model}/{run}/{ckpt}"


def eval_options(wildcards):
    """CLI flags of one `stapo eval` call, from the eval section (explicit, so each job's command says it all)."""
    ev = STUDY.eval
    bench = ev.benchmark(wildcards.benchmark)
    opts = {
        "--backend": ev.backend,
        "--samples": bench.samples,
        "--limit": bench.limit if bench.limit is not None else ev.limit,
        "--max-new-tokens": bench.max_new_tokens or ev.max_new_tokens,
        "--data-dir": ev.data_dir,
    }
    return " ".join(f"{k} {shlex.quote(str(v))}" for k, v in opts.items() if v is not None)  # values from the study


for _model in MODELS:
    for _method in METHODS:
        train_recipe_of(_model, _method)
for _bench in config["eval"]["benchmarks"]:
    for _setting in SETTINGS:
        eval_recipe_of(_bench, _setting)
