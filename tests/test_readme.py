"""Every command of the README, run (issue 32: two of them failed as written).

Each command is run in a scratch checkout (the repository's files linked into a temporary directory, so nothing
here writes into the real results/): as written where that is cheap, else in the cheap form named beside it, a
dry run (`-n`) or the CPU miniature's recipe where the command as written trains or evaluates at GPU scale. A few
cannot run here at all (conda, a finished workflow run); their entry says what covers them instead.
``test_every_readme_command_has_an_entry`` fails when the README gains a command without one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SLURM_ENV = {"STAPO_SLURM_ACCOUNT": "acct", "STAPO_SLURM_PARTITION": "gpu"}
TINY_TRAIN = "stapo train --recipe configs/tiny.yaml --model tiny-qwen3 --method stapo --out runs/tiny-qwen3/stapo " \
             "--max-steps 1"
TINY_EVAL = ("stapo eval --model runs/tiny-qwen3/stapo/final --benchmark arith --setting t1.0_p1.0 --out "
             "scores/tiny-qwen3/stapo/final/arith/t1.0_p1.0.jsonl --recipe configs/tiny.yaml --limit 2 --samples 1")

# README command -> (what this test runs, or None: not run here; why, where that is not the command as written)
CHEAP = {
    "make demo": ("make -n demo", "dry run: the demo trains for ~12 min (measured by hand, README)"),
    "make demo DATA_DIR=bundled": ("make -n demo DATA_DIR=bundled", "dry run, as make demo"),
    "make test": ("make -n test", "dry run: the fast tier takes ~3 min"),
    "make install": ("make -n install", "dry run: the test's own venv is installed"),
    "make lock": ("make -n lock", "dry run: it re-resolves the lock from PyPI"),
    ". .venv/bin/activate": (". .venv/bin/activate && test \"$(command -v stapo)\" = \"$VIRTUAL_ENV/bin/stapo\" && "
                             "test \"$(command -v snakemake)\" = \"$VIRTUAL_ENV/bin/snakemake\"",
                             "as written (the checkout's .venv is the test's own venv), then where stapo and "
                             "snakemake come from"),
    "snakemake --cores all results/table.md": ("snakemake -n --cores all results/table.md",
                                               "dry run: the paper's GPU study (the Snakefile's headline command)"),
    "make test-slow": ("make -n test-slow", "dry run: the slow tier takes ~15 min"),
    "make test-all": ("make -n test-all", "dry run: CI's whole run (~35 min)"),
    "make mutation": ("make -n mutation", "dry run: ~4 min of mutants, a measurement (not in CI)"),
    "make mini-study": ("make -n mini-study", "dry run: 86 min"),
    "make test-vllm": ("make -n test-vllm", "dry run: it builds a vLLM venv (~1 GB download)"),
    "make test-slurm": ("make -n test-slurm", "dry run: it needs root and installs SLURM"),
    "pip freeze --all": ("pip freeze --all", "as written (the test's venv)"),
    "pip install --no-deps -e .": ("pip install --no-deps --dry-run --no-build-isolation -e .",
                                   "dry run: the test's own venv keeps its install"),
    "python benchmarks/gpu_check.py": ("python benchmarks/gpu_check.py", "as written; on a CPU it must stop at "
                                       "once with one line (rc 2) naming --dry-run"),
    "python benchmarks/gpu_check.py --rollouts hf --no-eval": (
        "python benchmarks/gpu_check.py --rollouts hf --no-eval", "as written; on a CPU it stops as the line above"),
    "stapo plan --throughputs gpu_check/throughputs.yaml": (
        "stapo plan --throughputs gpu_check/throughputs.yaml", "as written, on a throughputs file of gpu_check's form"),
    "snakemake -n --quiet rules -- results/table.md": ("snakemake -n --quiet rules -- results/table.md", "as written"),
    "snakemake --profile workflow/profiles/local results/table.md": (
        "snakemake -n --profile workflow/profiles/local results/table.md", "dry run: the paper's GPU study"),
    "stapo plan": ("stapo plan", "as written"),
    "stapo schema --out workflow/schemas/config.schema.yaml": (
        "stapo schema --out schema.yaml && cmp schema.yaml workflow/schemas/config.schema.yaml",
        "written beside (workflow/ is the repository's own here) and compared with the file it refreshes"),
    "snakemake --profile workflow/profiles/slurm results/table.md": (
        "snakemake -n --profile workflow/profiles/slurm results/table.md",
        "dry run, with the two variables exported as the line before says"),
    "snakemake --cores all --config 'study_file=[configs/paper.yaml,configs/ablations.yaml]' -- results/table.md": (
        "snakemake -n --cores all --config 'study_file=[configs/paper.yaml,configs/ablations.yaml]' -- "
        "results/table.md", "dry run: the paper's GPU study"),
    "snakemake -n -p": ("snakemake -n -p", "as written"),
    "snakemake --cores all --config 'study_file=[configs/tiny.yaml,steps.yaml]' -- results/table.md": (
        "snakemake -n --cores all --config 'study_file=[configs/tiny.yaml,steps.yaml]' -- results/table.md",
        "dry run, steps.yaml holding what the README says"),
    "export STAPO_SLURM_ACCOUNT=<account> STAPO_SLURM_PARTITION=<gpu partition>": (
        None, "the environment of the SLURM command's run here (values for the placeholders)"),
    "conda env create -f environment.yml && conda activate stapo": (
        None, "needs conda and the network; tests/test_envs.py resolves environment.yml"),
    "conda env create -f environment.yml && conda activate stapo && pip install --no-deps -e .": (
        None, "as the line above, plus the pip line's dry run"),
    "snakemake --config study_file=configs/tiny.yaml --report report.html -- results/table.md": (
        None, "needs a finished workflow run: tests/test_workflow.py::test_tiny_dag_end_to_end runs this command "
              "after its run (its own study_file)"),
}
SLOW = {  # run in this order: the report reads what the training and evaluations wrote
    "stapo train --recipe configs/paper.yaml --model qwen3-8b-base --method stapo --out runs/qwen3-8b-base/stapo": (
        TINY_TRAIN, "the miniature's recipe and model, 1 step, instead of the paper's 8 GPUs"),
    "stapo eval --model runs/qwen3-8b-base/stapo/final --benchmark aime24 --setting t1.0_p1.0 --out "
    "scores/qwen3-8b-base/stapo/final/aime24/t1.0_p1.0.jsonl --recipe configs/paper.yaml": (
        TINY_EVAL, "the run above, the miniature's recipe, 2 problems"),
    "stapo eval --model bundled:smollm2-135m-instruct --benchmark arith --setting t0.7_p0.9 --out "
    "scores/cpu/arith.jsonl --recipe configs/tiny.yaml": (
        "stapo eval --model bundled:smollm2-135m-instruct --benchmark arith --setting t0.7_p0.9 --out "
        "scores/cpu/arith.jsonl --recipe configs/tiny.yaml", "as written (the CPU example)"),
    "stapo report --scores scores --runs runs --out results --config results/study.yaml": (
        "stapo report --scores scores --runs runs --out results --config results/study.yaml",
        "as written, results/study.yaml being the miniature's study as the workflow writes it"),
}


def readme_commands(text: str) -> set[str]:
    """The commands of the README: every line of its ```sh blocks (continuations joined, comments dropped), and
    inline `make ...` commands and inline commands with an option or a path and no placeholder."""
    found = set()
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            command = " ".join(line.split("  #")[0].split())
            if command and not command.startswith("#"):
                found.add(command)
    for span in re.findall(r"`((?:make|snakemake|stapo|python|pip) [^`]*)`", text):
        if span.startswith("make ") or (re.search(r" -|/", span) and not re.search(r"\.\.\.|<|\||DIR| k$", span)):
            found.add(" ".join(span.split()))
    return found


def test_every_readme_command_has_an_entry():
    commands = readme_commands((REPO / "README.md").read_text(encoding="utf-8"))
    entries = set(CHEAP) | set(SLOW)
    assert commands - entries == set(), "README commands without an entry in tests/test_readme.py"
    assert entries - commands == set(), "entries for commands the README no longer has"


@pytest.fixture
def checkout(tmp_path):
    """A scratch checkout: the repository's files linked into tmp_path (outputs land there, not in the repo)."""
    for name in ("Snakefile", "workflow", "configs", "benchmarks", "stapo", "Makefile", "pyproject.toml",
                 "environment.yml", "README.md", "requirements"):
        (tmp_path / name).symlink_to(REPO / name)
    (tmp_path / ".venv").symlink_to(BIN.parent)  # what `make install` builds, for the activation step
    (tmp_path / "steps.yaml").write_text("train: {max_steps: 30}\n")  # as the README describes it
    (tmp_path / "gpu_check").mkdir()  # what benchmarks/gpu_check.py writes on a GPU: a measured file of this form
    text = (REPO / "stapo" / "reference" / "throughputs.yaml").read_text(encoding="utf-8")
    (tmp_path / "gpu_check" / "throughputs.yaml").write_text(text.replace("analytic estimate", "measured"))
    return tmp_path


def printed_block(text: str, after: str) -> str:
    """The README's first fenced block (```...```) after the sentence ``after``: a command's printed output."""
    start = text.index("```", text.index(after))
    body = text.index("\n", start) + 1
    return text[body : text.index("```", body)]


def test_the_plan_block_is_what_stapo_plan_printed(tmp_path):
    """The README's `stapo plan` block is stapo plan's output on configs/paper.yaml: the slow test below runs the
    command and compares; here, that the block is a whole printout (header to the paper's scale)."""
    block = printed_block((REPO / "README.md").read_text(encoding="utf-8"), PLAN_SENTENCE)
    assert block.startswith("jobs: train 12, evaluate 1968, report 1") and block.rstrip().endswith("GPU-hours per run")


PLAN_SENTENCE = "Out of the box, on configs/paper.yaml"
DEMO = REPO / "docs" / "demo"  # the recorded `make demo` (benchmarks/demo_record.py)
DEMO_TABLE_SENTENCE = "`make demo` printed this table"
DEMO_INTERVALS_SENTENCE = "and these 95 % intervals"


def table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


def test_the_demo_table_is_the_recorded_run_rendered_now():
    """The README's demo table and intervals are docs/demo's (the recorded `make demo`), and docs/demo's table.md and
    intervals.md are what `stapo report` renders now from that run's scores.csv: neither the README nor the record
    can drift from the code or from the run they came from."""
    from stapo import study
    from stapo.report import table
    from stapo.report.results import load_paper, read_scores_csv

    tiny = study.read(REPO / "configs" / "tiny.yaml")
    layout = table._layout(read_scores_csv(DEMO / "scores.csv"), tiny)
    assert list(layout) == ["smollm2-135m"] and len(layout["smollm2-135m"]["methods"]) == 5  # base + 4 methods
    recorded = (DEMO / "table.md").read_text(encoding="utf-8")
    assert table_lines(table.render_markdown(layout, load_paper(), tiny)) == table_lines(recorded)
    assert table.render_intervals(layout, tiny) == (DEMO / "intervals.md").read_text(encoding="utf-8")
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert table_lines(printed_block(readme, DEMO_TABLE_SENTENCE)) == table_lines(recorded)
    assert table_lines(printed_block(readme, DEMO_INTERVALS_SENTENCE)) == table_lines(
        (DEMO / "intervals.md").read_text(encoding="utf-8"))
    # the record names the lock its environment was installed from, and the README names the record's lock
    lock = re.search(r"requirements/cpu.lock sha256 `([0-9a-f]{64})`", (DEMO / "RUN.md").read_text(encoding="utf-8"))
    assert lock and f"cpu.lock sha256 {lock[1][:12]}" in readme


def run(command: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, **SLURM_ENV, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    start = time.monotonic()
    res = subprocess.run(command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    print(f"rc {res.returncode} {time.monotonic() - start:7.1f} s: {command}")  # pytest -s lists every command
    return res


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.slow  # minutes: eight dry runs of the paper's 2,000-job DAG
def test_cheap_readme_commands_run(checkout):
    for readme, (command, why) in CHEAP.items():
        if command is None:
            print(f"not run: {readme} ({why})")
            continue
        if command.startswith("python benchmarks/gpu_check.py") and _has_gpu():
            continue  # on a GPU it is the one-GPU check itself (minutes), not this test's
        res = run(command, checkout)
        if command.startswith("python benchmarks/gpu_check.py"):
            assert res.returncode == 2 and "--dry-run" in res.stderr and res.stderr.count("\n") == 1, res.stderr
            continue
        assert res.returncode == 0, f"{readme}\n{res.stderr[-3000:]}"
        if command == "stapo plan":  # what the README shows it printing is what it prints now (issue 42)
            readme_text = (REPO / "README.md").read_text(encoding="utf-8")
            assert res.stdout == printed_block(readme_text, PLAN_SENTENCE), res.stdout
    # the README's old form of the dry run fails: --quiet takes the target as its value without `--`
    assert run("snakemake -n --quiet rules results/table.md", checkout).returncode != 0


@pytest.mark.slow
def test_slow_readme_commands_run(checkout):
    (checkout / "results").mkdir()
    study = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    study["eval"]["benchmarks"]["arith"] = {**(study["eval"]["benchmarks"]["arith"] or {}), "limit": 2, "samples": 1}
    # the study the report checks every cell against, as TINY_EVAL ran it (--limit 2 --samples 1)
    (checkout / "results" / "study.yaml").write_text(yaml.safe_dump(study, sort_keys=False), encoding="utf-8")
    for readme, (command, why) in SLOW.items():
        res = run(command, checkout, timeout=900)
        assert res.returncode == 0, f"{readme} ({why})\n{res.stderr[-3000:]}"
    table = (checkout / "results" / "table.md").read_text(encoding="utf-8")
    assert table.startswith("# STAPO reproduction — study `tiny`")
    # a bare `stapo report` (the README's prose) follows the study the out dir holds: it keeps the name
    assert run("stapo report", checkout).returncode == 0
    assert (checkout / "results" / "table.md").read_text(encoding="utf-8") == table
