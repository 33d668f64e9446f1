"""The Snakemake workflow: lint, dry-run job counts of the paper study, config validation, SLURM submission
(offline, stub sbatch/sacct/... on PATH) and, marked slow, the miniature DAG end to end."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # .venv/bin: snakemake and the `stapo` console script
PAPER = REPO / "configs" / "paper.yaml"
TINY = REPO / "configs" / "tiny.yaml"


def snakemake(*args, cwd: Path, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the repository's Snakefile with ``cwd`` as working directory (outputs land there, not in the repo)."""
    full_env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **(env or {})}
    cmd = [str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "-d", str(cwd), *map(str, args)]
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


SETUP = ("recipe", "study_file")  # the jobs that write each job's --recipe and results/study.yaml


def job_counts(output: str) -> dict[str, int]:
    """The 'Job stats' table of a dry run: rule -> count (without the SETUP jobs)."""
    table = output.split("Job stats:", 1)[1]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)
            if m.group(1) not in ("total", *SETUP)}


def planned_outputs(cwd: Path, *config_args) -> list[str]:
    """Every output file the DAG for results/table.md would create (snakemake --summary)."""
    res = snakemake("--summary", *config_args, "--", "results/table.md", cwd=cwd)
    assert res.returncode == 0, res.stderr
    return [line.split("\t", 1)[0] for line in res.stdout.splitlines()[1:] if line.strip()]


@pytest.mark.parametrize("config", [PAPER, TINY], ids=["paper", "tiny"])
def test_lint_reports_nothing(tmp_path, config):
    res = snakemake("--lint", "--configfile", config, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Lints for" not in res.stdout + res.stderr


def test_paper_dry_run_job_counts(tmp_path):
    study = yaml.safe_load(PAPER.read_text())
    every, max_steps = study["workflow"]["eval_every"], study["train"]["max_steps"]
    curve = 12 * len(range(every, max_steps, every)) if every else 0  # AIME24 at T 1.0 for checkpoint-N < final
    res = snakemake("-n", "--quiet", "rules", "--configfile", PAPER, "--", "results/table.md", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    # 3 models x 4 methods; (12 trained + 3 base) x 6 benchmarks x 2 settings evaluations (+ curve); one report
    # each curve checkpoint's evaluation reads its snapshot, moved out of the run by a local job (rule snapshot)
    assert job_counts(res.stdout) == {"train_nodes": 12, "evaluate": 12 * 6 * 2 + 3 * 6 * 2 + curve, "report": 1,
                                      "snapshot": curve}
    summaries = [f for f in planned_outputs(tmp_path, "--configfile", PAPER) if f.endswith(".summary.json")]
    assert len([f for f in summaries if f.split("/")[3] == "final"]) == 144
    assert len([f for f in summaries if f.split("/")[2:4] == ["base", "base"]]) == 36
    assert "scores/qwen3-14b-base/stapo/final/olympiadbench/t0.7_p0.9.summary.json" in summaries
    # eval_every counts rollout steps; checkpoint-N is named by TRL's optimiser step (4 per rollout step)
    assert f"scores/qwen3-8b-base/grpo/checkpoint-{4 * every}/aime24/t1.0_p1.0.summary.json" in summaries


def test_ablations_overlay_adds_methods_on_one_model(tmp_path):
    ablations = REPO / "configs" / "ablations.yaml"
    study = yaml.safe_load(PAPER.read_text())
    every, max_steps = study["workflow"]["eval_every"], study["train"]["max_steps"]
    methods = 4 + len(yaml.safe_load(ablations.read_text())["methods"])
    res = snakemake("-n", "--quiet", "rules", "--configfile", PAPER, ablations, "--", "results/table.md",
                    cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    curve = methods * len(range(every, max_steps, every))
    assert job_counts(res.stdout) == {"train_nodes": methods, "evaluate": (methods + 1) * 12 + curve, "report": 1,
                                      "snapshot": curve}


def test_related_overlay_plans_every_methods_training(tmp_path):
    """configs/related.yaml: the paper's four and every method of verl's and TRL's, each trained on the paper's
    recipe."""
    from stapo.study.methods import METHODS, Family

    related = REPO / "configs" / "related.yaml"
    methods = [k for k, m in METHODS.items() if m.family in (Family.PAPER, Family.VERL, Family.TRL)]
    assert len(methods) == 4 + 10 + 4
    from stapo.study import get_objective

    for key, entry in yaml.safe_load(related.read_text())["methods"].items():  # the overlay restates the defaults
        entry = dict(entry)
        assert get_objective(entry.pop("objective"), **entry) == get_objective(key), key
    res = snakemake("-n", "--quiet", "rules", "--configfile", PAPER, related, "--", "results/table.md", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert job_counts(res.stdout)["train_nodes"] == len(methods)
    planned = planned_outputs(tmp_path, "--configfile", PAPER, related)
    trained = {f.split("/")[2] for f in planned if f.startswith("runs/qwen3-1.7b-base/")}
    assert trained == set(methods), trained


def test_eval_every_sets_the_aime24_curve_jobs(tmp_path):
    extra = tmp_path / "curve.yaml"
    extra.write_text("workflow: {eval_every: 1000}\n")  # max_steps 3000 -> checkpoint-1000, -2000 (+ final)
    outputs = planned_outputs(tmp_path, "--configfile", PAPER, extra)
    curve = [f for f in outputs if "/checkpoint-" in f and f.endswith(".summary.json")]
    assert len(curve) == 12 * 2 and all(f.endswith("/aime24/t1.0_p1.0.summary.json") for f in curve)
    # rollout steps 1000 and 2000 = optimiser steps 4000 and 8000 (256 / 64 prompts per rollout batch); 20-Entropy's
    # own recipe (methods.entropy20.train: 512 / 32 prompts) names them 16000 and 32000
    steps = {(f.split("/")[2], f.split("/")[3]) for f in curve}
    assert {c for m, c in steps if m != "entropy20"} == {"checkpoint-4000", "checkpoint-8000"}
    assert {c for m, c in steps if m == "entropy20"} == {"checkpoint-16000", "checkpoint-32000"}


def test_tiny_dry_run_is_offline_arith_unless_data_dir(tmp_path):
    res = snakemake("-n", "--quiet", "rules", "--configfile", TINY, "--", "results/table.md", cwd=tmp_path)
    tiny = yaml.safe_load(TINY.read_text())
    n_models, n_methods = len(tiny["workflow"]["models"]), len(tiny["methods"])
    assert job_counts(res.stdout)["evaluate"] == n_models * (n_methods + 1) * 2  # arith only, both settings
    import shutil

    from stapo.tasks.registry import BUNDLED_DATA_DIR

    benchmarks = shutil.copytree(BUNDLED_DATA_DIR, tmp_path / "benchmarks")  # a data_dir must hold the files
    data = tmp_path / "data.yaml"
    data.write_text(f"eval: {{data_dir: {benchmarks}}}\n")
    res = snakemake("-n", "--quiet", "rules", "--configfile", TINY, data, "--", "results/table.md", cwd=tmp_path)
    assert job_counts(res.stdout)["evaluate"] == n_models * (n_methods + 1) * 7 * 2  # + the six real ones


def test_own_benchmark_and_setting_are_one_config_entry_each(tmp_path):
    """A study's own benchmark file and sampling setting: planned, its file an input, labels rerun nothing."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "gsm_tiny.jsonl").write_text('{"id": "g0", "problem": "1 + 1?", "answer": "2"}\n')
    extra = tmp_path / "own.yaml"
    extra.write_text("eval:\n  benchmarks: {gsm_tiny: {file: data/gsm_tiny.jsonl, label: GSM tiny, samples: 2}}\n"
                     "  settings: {t0.6_p0.95: {temperature: 0.6, top_p: 0.95, label: T0.6}}\n")
    res = snakemake("-n", "--quiet", "rules", "--configfile", TINY, extra, "--", "results/table.md", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    tiny = yaml.safe_load(TINY.read_text())
    n_models, n_methods = len(tiny["workflow"]["models"]), len(tiny["methods"])
    # arith and gsm_tiny (the real ones need a data_dir in the miniature) x the paper's two settings + t0.6_p0.95
    assert job_counts(res.stdout)["evaluate"] == n_models * (n_methods + 1) * 2 * 3
    outputs = planned_outputs(tmp_path, "--configfile", TINY, extra)
    assert any(f.endswith("/gsm_tiny/t0.6_p0.95.summary.json") for f in outputs)
    (tmp_path / "data" / "gsm_tiny.jsonl").unlink()
    res = snakemake("-n", "--configfile", TINY, extra, "--", "results/table.md", cwd=tmp_path)
    assert res.returncode != 0 and "data/gsm_tiny.jsonl" in res.stdout + res.stderr


def test_workflow_models_selects_a_subset(tmp_path):
    extra = tmp_path / "one.yaml"
    extra.write_text("workflow: {models: [qwen3-8b-base], eval_every: null}\n")
    res = snakemake("-n", "--quiet", "rules", "--configfile", PAPER, extra, "--", "results/table.md", cwd=tmp_path)
    # the paper's 8B trains on 8 nodes (configs/paper.yaml): rule train_nodes
    assert job_counts(res.stdout) == {"train_nodes": 4, "evaluate": 5 * 6 * 2, "report": 1}


def test_train_jobs_launch_accelerate_on_multi_gpu(tmp_path):
    one_node = tmp_path / "one_node.yaml"
    one_node.write_text("models: {qwen3-8b-base: {nodes: 1}}\n")
    res = snakemake("-n", "-p", "--configfile", PAPER, one_node, "--", "runs/qwen3-8b-base/stapo/final", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    # the study's relative path, found beside the Snakefile when the working directory (-d) does not hold it
    assert f"accelerate launch --config_file {REPO}/configs/accelerate/fsdp.yaml --num_processes 8 -m" in res.stdout
    assert re.search(r"-m stapo\.cli train --recipe results/recipes/[0-9a-f]{16}\.yaml --model qwen3-8b-base "
                     r"--method stapo", res.stdout)
    assert "srun" not in res.stdout
    # the paper's 8 nodes x 8 GPUs: one accelerate launch per node under srun (stapo.core.launch)
    res = snakemake("-n", "-p", "--configfile", PAPER, "--", "runs/qwen3-8b-base/stapo/final", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "srun --nodes=8 --ntasks-per-node=1 --gpus-per-node=8" in res.stdout
    assert "--num_machines 8 --num_processes 64 --machine_rank \"$SLURM_NODEID\"" in res.stdout


@pytest.mark.parametrize("patch, message", [
    ({"stuy": "typo"}, "stuy: unknown key"),
    ({"workflow": {"eval_bse": True}}, "workflow.eval_bse: unknown key"),
    ({"methods": {"stapo": {"objective": "stapo", "tau": 0.1}}}, "methods.stapo.tau: unknown key"),
    ({"eval": {"benchmarks": {"gsm_tiny": {"samples": 2}}}}, "eval.benchmarks.gsm_tiny: not a shipped benchmark"),
    ({"eval": {"settings": {"t0.6": {"temperature": 0.6}}}}, "eval.settings.t0.6: 'top_p' is a required property"),
    ({"models": {"qwen3-8b-base": {"spec": "Qwen/Qwen3-8B-Base", "gpu": 8}}}, "models.qwen3-8b-base.gpu: unknown key"),
])
def test_schema_rejects_bad_key_before_any_job(tmp_path, patch, message):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(patch))
    res = snakemake("-n", "--configfile", PAPER, bad, cwd=tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    # one line naming the config files and the key, not jsonschema's dump of the schema
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith(f"stapo config error: config ({PAPER}, {bad}): {message}"), out[-2000:]
    assert "Failed validating" not in out and "Building DAG" not in out


HOSTILE = ["a&touch INJECTED&b", "x;touch INJECTED", "$(touch INJECTED)", "`touch INJECTED`", "it's \"q\" > INJECTED",
           "two  spaces\tand|pipe"]
FAKE_STAPO = """#!{python}
import json, os, sys
from pathlib import Path
args = sys.argv[1:]
with open(os.environ["STAPO_ARGV_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
out = Path(args[args.index("--out") + 1])
out.write_text("")
out.with_name(out.name[: -len(".jsonl")] + ".summary.json").write_text("{{}}")
"""


def test_hostile_model_specs_reach_the_job_as_one_argument(tmp_path):
    """Every value a rule puts into a shell line is quoted: model specs (local directories named to inject, and the
    documented bundled:tiny-qwen3?layers=2&hidden=64) arrive as one argv entry, and nothing else runs. A stand-in
    `stapo` on PATH records its argv and writes the job's outputs."""
    specs = [str(tmp_path / "models" / name) for name in HOSTILE] + ["bundled:tiny-qwen3?layers=2&hidden=64"]
    for spec in specs[:-1]:
        Path(spec).mkdir(parents=True)
        (Path(spec) / "config.json").write_text("{}")
    fake = tmp_path / "bin" / "stapo"
    fake.parent.mkdir()
    fake.write_text(FAKE_STAPO.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    study = yaml.safe_load(TINY.read_text())
    study["models"] = {f"m{i}": {"spec": spec} for i, spec in enumerate(specs)}
    study["workflow"]["models"] = None
    study["eval"]["settings"] = {"t1.0_p1.0": {"temperature": 1.0, "top_p": 1.0}}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    targets = [f"scores/m{i}/base/base/arith/t1.0_p1.0.summary.json" for i in range(len(specs))]
    log = tmp_path / "argv.jsonl"
    res = snakemake("--cores", "1", "--configfile", tmp_path / "study.yaml", "--", *targets, cwd=tmp_path,
                    env={"PATH": f"{fake.parent}{os.pathsep}{BIN}{os.pathsep}{os.environ['PATH']}",
                         "STAPO_ARGV_LOG": str(log)})
    assert res.returncode == 0, res.stderr[-3000:]
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted(c[c.index("--model") + 1] for c in calls) == sorted(specs)
    assert all(c[0] == "eval" and len(c) == len(calls[0]) for c in calls)
    assert not list(tmp_path.rglob("INJECTED")) and not (REPO / "INJECTED").exists()


def _planned_recipe(cwd: Path, *config_args) -> str:
    """The --recipe of the planned stapo/smollm2 training job of the miniature."""
    res = snakemake("-n", "-p", *config_args, "--", "runs/smollm2-135m/stapo/final", cwd=cwd)
    assert res.returncode == 0, res.stderr
    return re.search(r"train --recipe (results/recipes/[0-9a-f]{16}\.yaml) ", res.stdout).group(1)


def test_a_dry_run_with_another_config_cannot_change_a_planned_job(tmp_path):
    """Point 1: parsing writes no config; each job's --recipe is a content-addressed file written by a job."""
    recipe = _planned_recipe(tmp_path, "--configfile", TINY)
    assert not (tmp_path / "results").exists()  # the dry run wrote nothing (it used to rewrite results/study.yaml)
    res = snakemake("--cores", "1", "--configfile", TINY, "--", recipe, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    written = (tmp_path / recipe).read_text()
    # exactly what the job reads: this model's spec, this method, the train section (no resources, no eval)
    doc = yaml.safe_load(written)
    tiny = yaml.safe_load(TINY.read_text())
    every, last = tiny["workflow"]["eval_every"], tiny["train"]["max_steps"]
    assert doc == {"models": {"smollm2-135m": {"spec": "bundled:smollm2-135m-instruct"}},
                   "methods": {"stapo": tiny["methods"]["stapo"]},  # + the snapshots its curve reads
                   "train": {**tiny["train"], "snapshot_steps": list(range(every, last, every)) if every else []}}
    lr = tmp_path / "lr.yaml"
    lr.write_text("train: {learning_rate: 3.0e-5}\n")
    other = _planned_recipe(tmp_path, "--configfile", TINY, lr)  # e.g. during the real run
    assert other != recipe and not (tmp_path / other).exists()
    assert (tmp_path / recipe).read_text() == written
    resources = tmp_path / "mem.yaml"  # resources are not the job's config: same recipe, no rerun
    resources.write_text("workflow: {train_mem_mb: 9999}\n")
    assert _planned_recipe(tmp_path, "--configfile", TINY, resources) == recipe
    own = tmp_path / "own.yaml"  # the method's own recipe (methods.<key>.train) is part of its job's config
    own.write_text("methods: {stapo: {train: {num_generations: 8}}}\n")
    assert _planned_recipe(tmp_path, "--configfile", TINY, own) not in (recipe, other)


def test_study_file_plans_what_configfile_plans(tmp_path):
    """``--config study_file=FILE`` (the documented way: stapo's bounded reader sees the raw file first) and
    ``--configfile FILE`` (kept for existing users) make the same study, overlays included; not both at once."""
    extra = tmp_path / "extra.yaml"
    extra.write_text("train: {max_steps: 30, save_total_limit: null}\nworkflow: {eval_every: 10}\n")
    by_configfile = snakemake("-n", "--quiet", "rules", "--configfile", TINY, extra, "--", "results/table.md",
                              cwd=tmp_path)
    by_study_file = snakemake("-n", "--quiet", "rules", "--config", f"study_file=[{TINY},{extra}]", "--",
                              "results/table.md", cwd=tmp_path)
    assert by_configfile.returncode == by_study_file.returncode == 0, by_study_file.stderr[-2000:]
    assert job_counts(by_study_file.stdout) == job_counts(by_configfile.stdout)
    both = snakemake("-n", "--configfile", TINY, "--config", f"study_file={TINY}", cwd=tmp_path)
    assert both.returncode != 0 and "give the study once" in both.stderr


def test_configfile_is_the_study_not_an_overlay_of_the_paper(tmp_path):
    """Point 6: a 2-method, 1-model study plans 2 training jobs (it planned the paper's 4 methods x 3 models)."""
    (tmp_path / "configs").mkdir()  # the paper's study where the workflow would find it: --configfile must win
    (tmp_path / "configs" / "paper.yaml").write_text(PAPER.read_text())
    study = yaml.safe_load(TINY.read_text())
    study["methods"] = {k: study["methods"][k] for k in ("justrl", "stapo")}
    own = tmp_path / "two.yaml"
    own.write_text(yaml.safe_dump(study))
    res = snakemake("-n", "--quiet", "rules", "--configfile", own, "--", "results/table.md", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert job_counts(res.stdout) == {"train": 2, "evaluate": (2 + 1) * 2, "report": 1}
    # a second --configfile overlays the first (maps merged key by key): one more method
    extra = tmp_path / "extra.yaml"
    extra.write_text("methods: {grpo: {objective: grpo}}\n")
    res = snakemake("-n", "--quiet", "rules", "--configfile", own, extra, "--", "results/table.md", cwd=tmp_path)
    assert job_counts(res.stdout)["train"] == 3


def readme_snakemake_commands() -> list[str]:
    """The `snakemake --cores all --config[file] ...` commands of the README and docs/internals.md, as written:
    inline code (wrapped lines joined) and code-block lines."""
    found = set()
    for doc in (REPO / "README.md", REPO / "docs" / "internals.md"):
        text = doc.read_text(encoding="utf-8")
        found.update(re.findall(r"`(snakemake --cores all --config[^`]+)`", text))
        found.update(re.findall(r"^(snakemake --cores all --config[^`\n]+)$", text, re.M))
    return sorted({" ".join(c.split()) for c in found})


def test_readme_commands_run_as_written(tmp_path):
    """Each README `snakemake --config study_file=...` command, dry-run in a directory holding what it names
    (configs/, the steps.yaml it describes): every one plans its target (--configfile used to swallow it)."""
    commands = readme_snakemake_commands()
    assert len(commands) >= 2 and all("study_file=" in c for c in commands), commands
    (tmp_path / "configs").symlink_to(REPO / "configs")
    (tmp_path / "steps.yaml").write_text("train: {max_steps: 30}\n")  # as the README describes it
    (tmp_path / "fast.yaml").write_text("train: {max_steps: 2}\n")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "HF_HUB_OFFLINE": "1"}
    for command in commands:
        argv = shlex.split(command)
        assert argv[-1] == "results/table.md", command
        res = subprocess.run([str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "-n", "--quiet", "rules",
                              *argv[1:]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, f"{command}\n{res.stderr[-2000:]}"
        assert job_counts(res.stdout)["report"] == 1, command  # the target's DAG, not just the default
    # the README's own shape of the mistake fails: a target right after the config files is read as one
    wrong = shlex.split(readme_snakemake_commands()[0].replace(" -- results/table.md", " results/table.md"))
    res = subprocess.run([str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "-n", *wrong[1:]], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0


def test_workdir_without_configfile_runs_the_paper_study(tmp_path):
    """`snakemake -d DIR` from anywhere: configs/paper.yaml is found beside the Snakefile, not inside DIR."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    res = snakemake("-n", "--quiet", "rules", cwd=elsewhere)  # -d elsewhere, cwd elsewhere: no configs/ there
    assert res.returncode == 0, res.stderr[-2000:]
    assert job_counts(res.stdout)["train_nodes"] == 12  # 8 nodes x 8 GPUs each


STUB = """#!/bin/sh
echo "$0 $*" >> {log}
case "$(basename "$0")" in
  sbatch) cat > /dev/null; echo 4242 ;;
  sacctmgr) echo "myacct" ;;
  sacct) echo "4242|COMPLETED" ;;
  squeue) ;;
  sinfo) echo "PARTITION"; echo "gpu" ;;
  *) ;;
esac
"""


def test_slurm_profile_submits_gpu_jobs(tmp_path):
    """Stub SLURM commands record the sbatch calls; the jobs 'complete' without outputs, so Snakemake then fails."""
    stubs, log = tmp_path / "stubs", tmp_path / "slurm_calls.log"
    stubs.mkdir()
    for name in ("sbatch", "sacct", "sacctmgr", "squeue", "scontrol", "sinfo", "scancel", "sshare"):
        (stubs / name).write_text(STUB.format(log=log))
        (stubs / name).chmod(stat.S_IRWXU)
    env = {"PATH": f"{stubs}{os.pathsep}{BIN}{os.pathsep}{os.environ['PATH']}",
           "STAPO_SLURM_ACCOUNT": "myacct", "STAPO_SLURM_PARTITION": "gpu"}
    targets = ["runs/qwen3-1.7b-base/grpo/final", "scores/qwen3-1.7b-base/base/base/aime24/t1.0_p1.0.summary.json"]
    snakemake("--profile", REPO / "workflow/profiles/slurm", "--configfile", PAPER, "--latency-wait", "1",
              "--retries", "0", "--slurm-init-seconds-before-status-checks", "1", "--", *targets,
              cwd=tmp_path, env=env, timeout=180)
    calls = [line for line in log.read_text().splitlines() if line.split()[0].endswith("sbatch")]
    train = next(c for c in calls if "rule_train" in c)
    evaluate = next(c for c in calls if "rule_evaluate" in c)
    # the paper's topology: 8 nodes, 64 GPUs, one task (srun: one accelerate launch) per node; CPUs from the model
    # entries: workflow.threads (8) per GPU process of a node
    assert "rule_train_nodes" in train and "--nodes=8" in train and "--gpus=64" in train and "--ntasks=8" in train
    assert "--ntasks-per-gpu" not in train and "--cpus-per-task=64" in train and "--mem 256000" in train
    assert "--gpus=1" in evaluate and "--cpus-per-task=8" in evaluate
    for call in (train, evaluate):
        assert "-A myacct" in call and "-p gpu" in call and " -t " in call


@pytest.mark.slow
def test_tiny_dag_end_to_end(tmp_path):
    """The miniature study on CPU with 2 cores: 1 training step, the arith benchmark, 1 sample, short generations."""
    study = yaml.safe_load(TINY.read_text())
    study["train"].update(max_steps=1, save_steps=1)
    arith = {**study["eval"]["benchmarks"].get("arith", {}), "samples": 1, "limit": 2}
    study["eval"].update(benchmarks={"arith": arith}, data_dir=None, max_new_tokens=16)
    model = "tiny-qwen3" if "tiny-qwen3" in study["models"] else next(iter(study["models"]))  # fastest
    study["workflow"] = {**study.get("workflow", {}), "models": [model], "eval_every": None}
    cfg = tmp_path / "tiny-ci.yaml"  # a whole file, not an overlay: Snakemake would merge the benchmark maps
    cfg.write_text(yaml.safe_dump(study, sort_keys=False))
    res = snakemake("--cores", "2", "--config", f"study_file={cfg}", "--", "results/table.md", cwd=tmp_path,
                    timeout=900)
    assert res.returncode == 0, res.stderr[-5000:]
    table = (tmp_path / "results" / "table.md").read_text()
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip().strip("|").split("|")[1:]]
            for line in table.splitlines() if line.startswith("| ") and not line.startswith("| Method")}
    assert list(rows) == ["Base", "GRPO", "20-Entropy", "JustRL", "STAPO"]
    assert all(re.match(r"^\d+\.\d{2} \(\d+\.\d{2}\)$", c) for cells in rows.values() for c in cells), table
    for kind in ("entropy", "reward"):
        for ext in ("png", "pdf"):
            assert (tmp_path / "results" / "figures" / f"{model}_{kind}.{ext}").stat().st_size > 0
    index = (tmp_path / "results" / "figures.md").read_text()  # base and final only: two points are no curve
    assert "not drawn: only the base model and the final checkpoint are evaluated on arith" in index, index
    res = snakemake("--config", f"study_file={cfg}", "--report", "report.html", "--", "results/table.md",
                    cwd=tmp_path)
    assert res.returncode == 0 and (tmp_path / "report.html").stat().st_size > 0, res.stderr[-3000:]


@pytest.mark.slow
def test_a_training_job_dies_with_its_killed_driver(tmp_path):
    """kill -9 of the Snakemake driver during `stapo train`: the job stops within seconds (stapo.core.driver) instead of
    training on orphaned, so the rerun finds its run directory free (it used to refuse: "in use by PID")."""
    from stapo.core.lock import RUN_LOCK, Busy, hold, holder

    study = yaml.safe_load(TINY.read_text())
    study["train"].update(max_steps=1000, save_steps=1000, max_completion_length=8)
    study["workflow"]["models"] = ["tiny-qwen3"]
    cfg = tmp_path / "long.yaml"
    cfg.write_text(yaml.safe_dump(study, sort_keys=False))
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "HF_HUB_OFFLINE": "1"}
    driver = subprocess.Popen([str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "-d", str(tmp_path), "--cores",
                               "1", "--configfile", str(cfg), "--", "runs/tiny-qwen3/justrl/final"], cwd=tmp_path,
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    lock, log = tmp_path / "runs/tiny-qwen3/justrl" / RUN_LOCK, tmp_path / "logs/train/tiny-qwen3/justrl.log"
    deadline = time.monotonic() + 300
    while not (holder(lock).get("pid") and "Loading weights" in (log.read_text() if log.exists() else "")):
        assert time.monotonic() < deadline and driver.poll() is None, "the training job did not start"
        time.sleep(0.5)
    job = holder(lock)["pid"]
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    deadline = time.monotonic() + 30

    def running(pid):
        stat = Path(f"/proc/{pid}/stat")
        return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"  # Z: exited, not reaped

    def free():  # what the rerun takes first; a thread of the exiting job may hold it a moment after its leader
        try:
            with hold(lock, "run directory"):
                return True
        except Busy:
            return False

    try:
        while running(job) or not free():
            assert time.monotonic() < deadline, f"stapo train (PID {job}) outlived its driver"
            time.sleep(0.2)
    finally:
        if Path(f"/proc/{job}").exists():  # the orphan of a failed assertion
            os.kill(job, signal.SIGKILL)
    assert "the Snakemake process that started this job" in log.read_text()
