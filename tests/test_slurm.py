"""The SLURM profile (workflow/profiles/slurm) against stub commands and against a real scheduler.

Always (stub sbatch, no scheduler): an unset STAPO_SLURM_* variable stops the run with one line before anything
is submitted; per-job CPUs come from the model entries.

On a real one-node SLURM (``make test-slurm``: tests/slurm/cluster.sh starts it as root and sets
STAPO_TEST_SLURM_PARTITION; marker ``slurm``, skipped elsewhere), through the profile and the real executor plugin:
- the tiny study to results/table.md, every train/evaluate job submitted with sbatch;
- a training job cancelled mid-run (scancel) is resubmitted by Snakemake and resumes from its checkpoint to the
  weights of an uninterrupted run;
- a failing job makes Snakemake exit non-zero within 2 minutes, with and without sacct on PATH (this cluster has
  no accounting: sacct fails);
- every distinct request of the paper study's jobs is accepted by slurmctld for its 8-GPU node (sbatch --test-only).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # .venv/bin: snakemake and `stapo`
PROFILE = ROOT / "workflow" / "profiles" / "slurm"
PAPER, TINY = ROOT / "configs" / "paper.yaml", ROOT / "configs" / "tiny.yaml"
PARTITION = os.environ.get("STAPO_TEST_SLURM_PARTITION")
PAPER_PARTITION = os.environ.get("STAPO_TEST_SLURM_PAPER_PARTITION")  # 8 nodes of 8 GPUs (cluster.sh)
SHORT_PARTITION = os.environ.get("STAPO_TEST_SLURM_SHORT_PARTITION")  # MaxTime 2 minutes (cluster.sh)
SBATCH = shutil.which("sbatch") or "/usr/bin/sbatch"

# sbatch as the plugin calls it, recorded: one line per call, "<exit status>\t<output>\t<arguments>".
RECORDING_SBATCH = """#!/bin/sh
out=$({sbatch} {extra} "$@" 2>&1); rc=$?
printf '%s\\t%s\\t%s\\n' "$rc" "$(echo "$out" | tr '\\t\\n' '  ')" "$*" >> {log}
{reply}
exit $rc
"""


def write_exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(stat.S_IRWXU)
    return path


def sbatch_calls(log: Path) -> list[dict]:
    calls = []
    for line in log.read_text().splitlines() if log.exists() else []:
        rc, out, args = line.split("\t", 2)
        comment = re.search(r"--comment '?(rule_\S+?)'? ", args + " ")
        calls.append({"rc": int(rc), "out": out.strip(), "args": args, "job": comment.group(1) if comment else ""})
    return calls


def request(args: str) -> tuple:
    """(CPUs, GPUs, memory MB, minutes) of one sbatch call as the plugin writes it."""
    def flag(pattern, default=None):
        m = re.search(pattern, args)
        return int(m.group(1)) if m else default
    return (flag(r"--cpus-per-task=(\d+)"), flag(r"--gpus=(\d+)", 0), flag(r"--mem (\d+)"), flag(r" -t '?(\d+)"))


def snakemake_env(bin_dir: Path, path: str | None = None, **extra) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "STAPO_SLURM_ACCOUNT": "stapo-test", "STAPO_SLURM_PARTITION": PARTITION or "gpu", **extra}
    env["PATH"] = os.pathsep.join([str(bin_dir), str(BIN), path or os.environ["PATH"]])
    return env


def snakemake_cmd(workdir: Path, *args) -> list[str]:
    return [str(BIN / "snakemake"), "-s", str(ROOT / "Snakefile"), "-d", str(workdir), "--profile", str(PROFILE),
            "--latency-wait", "5", *map(str, args)]


def tiny_study(tmp_path: Path, methods=None, **train) -> Path:
    """configs/tiny.yaml cut to minutes: the random-init tiny Qwen3, short runs, arith only, one setting."""
    study = yaml.safe_load(TINY.read_text())
    study["train"].update({"max_steps": 1, "save_steps": 1, **train})
    if methods:
        study["methods"] = {m: study["methods"][m] for m in methods}
    arith = {**study["eval"]["benchmarks"]["arith"], "samples": 1, "limit": 2}
    study["eval"].update(benchmarks={"arith": arith}, data_dir=None, max_new_tokens=16,
                         settings={"t1.0_p1.0": study["eval"]["settings"]["t1.0_p1.0"]})
    study["workflow"].update(models=["tiny-qwen3"], eval_every=None, curve_settings=None)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


# ------------------------------------------------------------------------------------------- without a cluster


STUB_SBATCH = "#!/bin/sh\necho \"$*\" >> {log}\ncat > /dev/null\necho 4242\n"


@pytest.mark.parametrize("missing", ["STAPO_SLURM_PARTITION", "STAPO_SLURM_ACCOUNT"])
def test_unset_profile_variable_is_one_line_before_any_submission(tmp_path, missing):
    stubs, log = tmp_path / "stubs", tmp_path / "sbatch.log"
    stubs.mkdir()
    write_exe(stubs / "sbatch", STUB_SBATCH.format(log=log))
    env = snakemake_env(stubs)
    env.pop(missing)
    proc = subprocess.run(snakemake_cmd(tmp_path, "--configfile", PAPER, "--", "runs/qwen3-1.7b-base/grpo/final"),
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert errors == [f"stapo profile error: {missing} is not set: export {missing}=<value> "
                      f"(default resource {'slurm_partition' if 'PARTITION' in missing else 'slurm_account'})"], \
        proc.stderr[-2000:]
    assert not log.exists()  # nothing was submitted


def test_job_cpus_come_from_the_model_entries(tmp_path):
    """workflow.threads per GPU process by default (paper: 8 x 8 GPUs, 8 x 1), a model's train_cpus/eval_cpus win;
    the threads are what the SLURM plugin requests as --cpus-per-task."""
    extra = tmp_path / "cpus.yaml"
    extra.write_text("models:\n  qwen3-8b-base: {spec: Qwen/Qwen3-8B-Base, gpus: 4, train_cpus: 24, eval_cpus: 3,"
                     " accelerate_config: configs/accelerate/zero3.yaml}\n")
    targets = {"runs/qwen3-1.7b-base/grpo/final": 64, "scores/qwen3-1.7b-base/base/base/aime24/t1.0_p1.0.jsonl": 8,
               "runs/qwen3-8b-base/grpo/final": 24, "scores/qwen3-8b-base/base/base/aime24/t1.0_p1.0.jsonl": 3}
    proc = subprocess.run([str(BIN / "snakemake"), "-s", str(ROOT / "Snakefile"), "-d", str(tmp_path), "-n",
                           "--cores", "1000", "--configfile", PAPER, extra, "--", *targets],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    threads = {job["output"]: job["threads"] for job in dry_run_jobs(proc.stdout) if job["rule"] != "recipe"}
    assert threads == targets


# ---------------------------------------------------------------------------------------------- on the cluster


def on_cluster(test):
    """Marks of a test that needs the local cluster: ``slurm`` (selected by make test-slurm), ``slow``, skipped
    without it."""
    skip = pytest.mark.skipif(not PARTITION, reason="needs the local SLURM cluster: make test-slurm (root)")
    return pytest.mark.slurm(pytest.mark.slow(skip(test)))


def recording_bin(tmp_path: Path, extra: str = "", reply: str = 'echo "$out"') -> tuple[Path, Path]:
    bin_dir, log = tmp_path / "bin", tmp_path / "sbatch.log"
    bin_dir.mkdir(exist_ok=True)
    write_exe(bin_dir / "sbatch", RECORDING_SBATCH.format(sbatch=SBATCH, extra=extra, log=log, reply=reply))
    return bin_dir, log


def slurm_log_of(workdir: Path, job_id: str) -> list[Path]:
    return list((workdir / ".snakemake" / "slurm_logs").rglob(f"{job_id}.log"))


@on_cluster
def test_tiny_study_through_the_slurm_profile(tmp_path):
    bin_dir, log = recording_bin(tmp_path)
    study = tiny_study(tmp_path)
    t0 = time.monotonic()
    proc = subprocess.run(snakemake_cmd(tmp_path, "--configfile", study, "--jobs", "2", "--slurm-keep-successful-logs",
                                        "--slurm-init-seconds-before-status-checks", "10", "--", "results/table.md"),
                          env=snakemake_env(bin_dir), capture_output=True, text=True, timeout=2400)
    assert proc.returncode == 0, proc.stderr[-6000:]
    table = (tmp_path / "results" / "table.md").read_text()
    assert [m for m in ("Base", "GRPO", "20-Entropy", "JustRL", "STAPO") if f"| {m} " in table] == \
        ["Base", "GRPO", "20-Entropy", "JustRL", "STAPO"], table
    calls = sbatch_calls(log)
    assert calls and all(c["rc"] == 0 and c["out"].isdigit() for c in calls), calls
    jobs = {c["job"] for c in calls}
    train = {f"rule_train_wildcards_tiny-qwen3_{m}" for m in ("grpo", "entropy20", "justrl", "stapo")}
    evaluate = {f"rule_evaluate_wildcards_tiny-qwen3_{m}_{c}_arith_t1.0_p1.0"
                for m, c in [("base", "base")] + [(m, "final") for m in ("grpo", "entropy20", "justrl", "stapo")]}
    assert train | evaluate <= jobs, sorted(jobs)
    for c in calls:  # each ran as a SLURM job: the plugin's per-job log under .snakemake/slurm_logs
        assert slurm_log_of(tmp_path, c["out"]), c
    print(f"\ntiny study through SLURM: {len(calls)} sbatch jobs ({len(train)} train, {len(evaluate)} evaluate, "
          f"{len(calls) - len(train) - len(evaluate)} other) in {time.monotonic() - t0:.0f} s")


def _wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"snakemake exited ({proc.returncode}) while waiting for {what}")
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


def stop(proc: subprocess.Popen, kill: bool = False) -> None:
    """End a Snakemake still running: SIGINT (it cancels its SLURM jobs), SIGKILL after 60 s or at once."""
    if proc.poll() is not None:
        return
    if not kill:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
            return
        except subprocess.TimeoutExpired:
            pass
    proc.kill()
    proc.wait(30)


def _weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


@on_cluster
def test_cancelled_training_job_resumes_to_the_weights_of_an_uninterrupted_run(tmp_path):
    """Killed without warning (scancel --signal=KILL) after the first complete checkpoint; the profile's retries
    resubmit the job, `stapo train` resumes.

    The random-init model earns no reward (zero advantages): its updates are AdamW's weight decay, so the learning
    rate is raised until 5 steps move the weights measurably; the comparison with the initial weights shows it."""
    import torch

    bin_dir, log = recording_bin(tmp_path)
    study = tiny_study(tmp_path, methods=["stapo"], max_steps=5, learning_rate=0.05, weight_decay=0.1,
                       warmup_steps=0, save_total_limit=None)
    run, output = tmp_path / "runs" / "tiny-qwen3" / "stapo", tmp_path / "snakemake.out"
    proc = subprocess.Popen(snakemake_cmd(tmp_path, "--configfile", study, "--jobs", "1",
                                          "--slurm-init-seconds-before-status-checks", "5", "--",
                                          "runs/tiny-qwen3/stapo/final"),
                            env=snakemake_env(bin_dir), stdout=output.open("w"), stderr=subprocess.STDOUT)
    try:
        job = _wait_for(lambda: next((c["out"] for c in sbatch_calls(log) if "rule_train" in c["job"]), None), 120,
                        "the training job's submission", proc)
        done = _wait_for(lambda: sorted(run.glob("checkpoint-*/STAPO_CHECKPOINT_COMPLETE")), 600,
                         "a complete checkpoint", proc)
        assert not (run / "final").exists(), "the run finished before it could be cancelled"
        subprocess.run(["scancel", "--signal=KILL", "--full", job], check=True)  # no warning, no checkpoint
        cancelled_at = len(done)
        metrics_then = (run / "metrics.jsonl").read_text().splitlines()
        proc.wait(timeout=1200)
    finally:
        stop(proc)
    assert proc.returncode == 0, output.read_text()[-6000:]
    trains = [c for c in sbatch_calls(log) if "rule_train" in c["job"]]
    assert len(trains) == 2 and trains[0]["out"] == job, trains  # cancelled, then resubmitted
    rows = (run / "metrics.jsonl").read_text().splitlines()
    assert [yaml.safe_load(r)["step"] for r in rows] == list(range(1, 6))
    # resumed, not restarted: the rows written before the cancel survive as they were (timings included)
    steps_before = [r for r in metrics_then if yaml.safe_load(r)["step"] <= int(done[-1].parent.name.split("-")[1])]
    assert steps_before and rows[:len(steps_before)] == steps_before[:len(rows)]

    ref = tmp_path / "uninterrupted"
    subprocess.run([str(BIN / "stapo"), "train", "--recipe", str(study), "--model", "tiny-qwen3", "--method", "stapo",
                    "--out", str(ref)], check=True, env=snakemake_env(bin_dir), capture_output=True, timeout=900)
    resumed, uninterrupted = _weights(run / "final"), _weights(ref / "final")
    assert resumed.keys() == uninterrupted.keys()
    delta = max(float((resumed[k].float() - uninterrupted[k].float()).abs().max()) for k in resumed)
    # the study keeps no checkpoints once final/ is written (workflow.keep_checkpoints: false): the training job
    # pruned them after its resumed run; the uninterrupted `stapo train` (no workflow) keeps its own
    assert not list(run.glob("checkpoint-*")), sorted(p.name for p in run.glob("checkpoint-*"))
    first = _weights(ref / "checkpoint-1")  # weights after the first step
    moved = max(float((uninterrupted[k].float() - first[k].float()).abs().max()) for k in first)
    print(f"\ncancel/resume: cancelled after {cancelled_at} complete checkpoint(s); max|Δθ| resumed vs "
          f"uninterrupted = {delta:.3g}; max|θ_final - θ_step1| = {moved:.3g}")
    assert moved > 1e-4, "the weights barely move: the comparison would be vacuous"
    assert delta == 0.0, f"resumed weights differ from the uninterrupted run's: max|Δθ| = {delta}"
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in resumed)


def continued_study(tmp_path: Path, max_steps: int) -> Path:
    """The tiny study's stapo run on 2 training processes (accelerate launch, DDP on CPU ranks), in jobs of at most
    2 minutes (the short partition's real MaxTime) asked to leave 60 s ahead of it (at most half the job), no periodic
    checkpoint. 8 completions of 8 tokens a step: ~8 s on 2 quiet cores, after ~30 s of start-up (batch script, the
    job's Snakemake, accelerate launch, model); this SLURM sends the signal up to 30 s early (its periodic check), so
    a job trains 2-5 rollout steps under load (measured: 11 steps, 8 jobs) and 11 steps quiet take 2 jobs."""
    path = tiny_study(tmp_path, methods=["stapo"], max_steps=max_steps, learning_rate=0.05, weight_decay=0.1,
                      warmup_steps=0, save_steps=1000, prompts_per_generation=2, prompts_per_step=2,
                      num_generations=4, per_device_train_batch_size=4, max_completion_length=8)
    engine = yaml.safe_load((ROOT / "configs" / "accelerate" / "ddp.yaml").read_text())
    engine["mixed_precision"] = "no"
    (tmp_path / "ddp-cpu.yaml").write_text(yaml.safe_dump(engine))
    study = yaml.safe_load(path.read_text())
    study["models"]["tiny-qwen3"].update(gpus=2, accelerate_config=str(tmp_path / "ddp-cpu.yaml"))
    study["workflow"].update(train_runtime=2, train_leave_before=60, threads=1)
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


@on_cluster
def test_a_run_longer_than_the_wall_time_limit_continues_over_jobs_to_the_uninterrupted_weights(tmp_path):
    """A partition whose real MaxTime (2 min) is shorter than the run: each job gets SIGUSR1 60 s ahead of its limit
    (sbatch --signal; this SLURM sends it up to 30 s earlier), saves a checkpoint at its next rollout boundary, exits
    75 and requeues itself (scontrol requeue, the same job id); Snakemake waits on the pending job, not counting a
    failure (--retries 0 here); the run ends after >= 2 jobs with the weights of an uninterrupted run on the same 2
    processes, and each job that left kept its log.

    Measured 2026-12-07 on 2 cores shared with two other sessions (load 7): 1 submission, 8 jobs, 11 steps, 731 s,
    max|Δθ| = 0; the test 834 s with its reference run (with 7 steps: 2 jobs, 188 s; so 11). On the same 2 cores
    quiet (a fresh-clone make test-slurm, nothing else running): 2 jobs, 11 steps, 132 s, max|Δθ| = 0. So the test
    asserts at least one continuation (a job that left, its kept log, the rerun to equal weights), not the number
    of jobs a machine's speed makes."""
    import torch

    bin_dir, log = recording_bin(tmp_path)
    study = continued_study(tmp_path, max_steps=int(os.environ.get("STAPO_TEST_CONTINUED_STEPS", "11")))
    run = tmp_path / "runs" / "tiny-qwen3" / "stapo"
    t0 = time.monotonic()
    proc = subprocess.run(snakemake_cmd(tmp_path, "--configfile", study, "--jobs", "1", "--retries", "0",
                                        "--slurm-init-seconds-before-status-checks", "5", "--",
                                        "runs/tiny-qwen3/stapo/final"),
                          env=snakemake_env(bin_dir, STAPO_SLURM_PARTITION=SHORT_PARTITION), capture_output=True,
                          text=True, timeout=1200)
    seconds = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-6000:]
    trains = [c for c in sbatch_calls(log) if "rule_train" in c["job"]]
    assert len(trains) == 1 and "--signal=USR1@60" in trains[0]["args"] and "--requeue" in trains[0]["args"], trains
    info = subprocess.run(["scontrol", "show", "job", trains[0]["out"]], capture_output=True, text=True).stdout
    restarts = int(re.search(r"Restarts=(\d+)", info).group(1))  # requeues of the one submitted job
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))

    ref = tmp_path / "uninterrupted"
    cmd = ["accelerate", "launch", "--config_file", str(tmp_path / "ddp-cpu.yaml"), "--num_processes", "2",
           "-m", "stapo.cli", "train", "--recipe", str(study), "--model", "tiny-qwen3", "--method", "stapo",
           "--out", str(ref)]
    subprocess.run(cmd, check=True, env=snakemake_env(bin_dir), capture_output=True, timeout=900)
    resumed, uninterrupted = _weights(run / "final"), _weights(ref / "final")
    delta = max(float((resumed[k].float() - uninterrupted[k].float()).abs().max()) for k in resumed)
    print(f"\ncontinued run: 1 submission, {restarts + 1} jobs (requeued by themselves), "
          f"{len(rows)} steps, {seconds:.0f} s; max|Δθ| vs uninterrupted = {delta:.3g}")
    assert restarts >= 1, info  # how many depends on the machine's speed: 2 jobs quiet, 8 at load 7 (measured)
    logs = tmp_path / "logs" / "train" / "tiny-qwen3"  # each job that left kept its log as stapo.log.<k>
    assert sorted(p.name for p in logs.glob("stapo.log.*")) == [f"stapo.log.{k}" for k in range(1, restarts + 1)]
    for k in range(1, restarts + 1):
        text = (logs / f"stapo.log.{k}").read_text()
        assert "received: saving checkpoint-" in text and "requeueing SLURM job" in text, text[-3000:]
    assert delta == 0.0 and all(torch.equal(resumed[k], uninterrupted[k]) for k in resumed)


def path_without(tool: str, tmp_path: Path) -> str:
    """PATH entries of this process, with every directory holding `tool` replaced by a copy (symlinks) without it."""
    parts = []
    for i, entry in enumerate(os.environ["PATH"].split(os.pathsep)):
        d = Path(entry)
        if not (d / tool).exists():
            parts.append(entry)
            continue
        shadow = tmp_path / f"path{i}"
        shadow.mkdir()
        for exe in d.iterdir():
            if exe.name != tool:
                (shadow / exe.name).symlink_to(exe)
        parts.append(str(shadow))
    return os.pathsep.join(parts)


@on_cluster
@pytest.mark.parametrize("sacct", ["sacct on PATH (no accounting: it fails)", "no sacct on PATH"])
def test_failing_job_makes_snakemake_exit_nonzero_within_2_minutes(tmp_path, sacct):
    """The training command fails in its job (a `stapo` that exits 3, first on the job's PATH); no retries, and no
    continuation: the job is not requeued."""
    bin_dir, log = recording_bin(tmp_path)
    write_exe(bin_dir / "stapo", "#!/bin/sh\necho 'stapo: failing on purpose' >&2\nexit 3\n")
    path = None if sacct.startswith("sacct") else path_without("sacct", tmp_path)
    env = snakemake_env(bin_dir, path)
    assert (shutil.which("sacct", path=env["PATH"]) is None) == (path is not None)
    t0 = time.monotonic()
    try:
        proc = subprocess.run(snakemake_cmd(tmp_path, "--configfile", tiny_study(tmp_path, methods=["stapo"]),
                                            "--retries", "0", "--", "runs/tiny-qwen3/stapo/final"),
                              env=env, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{sacct}: snakemake still running 120 s after submitting a failing job (a hang)")
    seconds = time.monotonic() - t0
    print(f"\nfailing job, {sacct}: snakemake exit {proc.returncode} after {seconds:.0f} s")
    assert proc.returncode != 0
    calls = sbatch_calls(log)
    assert len(calls) == 1 and "rule_train" in calls[0]["job"] and calls[0]["rc"] == 0, calls
    assert "Error in rule train" in proc.stderr, proc.stderr[-3000:]
    # a failure writes no stapo.continue: the requeueable training job did not requeue itself (continuations do)
    info = subprocess.run(["scontrol", "show", "job", calls[0]["out"]], capture_output=True, text=True).stdout
    assert re.search(r"Restarts=0\b", info), info


# Rules that run inside the Snakemake process (`localrule: True`), never submitted; a dry run prints them as `rule`.
LOCAL_RULES = {name for smk in (ROOT / "workflow" / "rules").glob("*.smk")
               for name, body in re.findall(r"^rule (\w+):\n((?:[ \t]+.*\n|\n)*)", smk.read_text(), flags=re.M)
               if re.search(r"^\s+localrule: True", body, flags=re.M)}


def dry_run_jobs(text: str) -> list[dict]:
    """The jobs a dry run (-n) prints: rule, local or not, first output, threads, resources."""
    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", text):
        head = re.match(r"(local)?rule (\w+):", block)
        if not head:
            continue
        local = bool(head.group(1)) or head.group(2) in LOCAL_RULES
        resources = re.search(r"resources: (.*)", block)
        threads, output = re.search(r"threads: (\d+)", block), re.search(r"output: ([^,\s]+)", block)
        jobs.append({"rule": head.group(2), "local": local, "output": output and output.group(1),
                     "threads": int(threads.group(1)) if threads else 1,
                     "resources": dict(re.findall(r"(\w+)=([^,\n]+)", resources.group(1))) if resources else {}})
    return jobs


def dag_requests(config: Path, workdir: Path) -> tuple[int, dict]:
    """(number of jobs, {(rule, CPUs, GPUs, memory MB, minutes): jobs}) of the study's whole DAG (a dry run)."""
    proc = subprocess.run([str(BIN / "snakemake"), "-s", str(ROOT / "Snakefile"), "-d", str(workdir), "-n",
                           "--cores", "4096", "--configfile", config, "--", "results/table.md"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs, requests = dry_run_jobs(proc.stdout), {}
    for job in jobs:
        if job["local"]:
            continue  # runs in the Snakemake process itself, never submitted
        res = job["resources"]
        key = (job["rule"], job["threads"], int(res.get("gpu", 0)), int(res["mem_mb"]), int(res["runtime"]))
        requests[key] = requests.get(key, 0) + 1
    return len(jobs), requests


@on_cluster
def test_paper_study_requests_fit_8_gpu_nodes(tmp_path):
    """Every distinct request of configs/paper.yaml's jobs, accepted by slurmctld (sbatch --test-only) for the
    cluster's paper partition: 8 nodes of 8 GPUs, 64 CPUs, ~1 TB (cluster.sh), where each training job asks for all
    8 nodes (--nodes=8 --gpus=64 --ntasks=8, rule train_nodes). The jobs Snakemake can submit at once (every
    training job, the base model's evaluations) go through the real plugin with an sbatch that tests instead of
    submitting; requests only later jobs have (none, unless a checkpoint's evaluation differs from the base
    model's) and the report's are tested with the same flags."""
    n, requests = dag_requests(PAPER, tmp_path / "dag")
    assert n == 2007 + 1788, n  # + the local snapshot moves (never submitted)
    bin_dir, log = recording_bin(tmp_path, extra="--test-only", reply="echo 1")
    output = tmp_path / "snakemake.out"
    proc = subprocess.Popen(snakemake_cmd(tmp_path, "--configfile", PAPER, "--jobs", "100", "--", "results/table.md"),
                            env=snakemake_env(bin_dir, STAPO_SLURM_PARTITION=PAPER_PARTITION),
                            stdout=output.open("w"), stderr=subprocess.STDOUT)
    try:
        ready = 12 + 36  # training jobs and base-model evaluations: the DAG's jobs without unfinished inputs
        _wait_for(lambda: len(sbatch_calls(log)) >= ready, 300, f"{ready} submissions", proc)
    finally:
        stop(proc, kill=True)  # its "jobs" were only tested: nothing to wait for
    calls = sbatch_calls(log)
    rejected = [c for c in calls if c["rc"] != 0]
    assert not rejected, rejected[:3]
    assert all("to start at" in c["out"] and f"-p {PAPER_PARTITION}" in c["args"] for c in calls), calls[:3]
    trains = [c for c in calls if c["job"].startswith("rule_train_nodes_")]
    assert len(trains) == 12 and all(f in c["args"] for c in trains for f in ("--nodes=8", "--gpus=64", "--ntasks=8"))
    assert all("on nodes paper[1-8]" in c["out"] for c in trains), trains[:1]
    submitted = {(re.match(r"rule_(\w+?)(?:_wildcards|$)", c["job"]).group(1),) + request(c["args"]) for c in calls}
    missing = {k for k in requests if k not in submitted}
    for rule, cpus, gpus, mem, minutes in sorted(missing):
        res = subprocess.run([SBATCH, "--test-only", "-p", PAPER_PARTITION, "--ntasks=1", f"--cpus-per-task={cpus}",
                              "--mem", str(mem), "-t", str(minutes), *([f"--gpus={gpus}"] if gpus else []),
                              "--wrap", "true"], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0 and "to start at" in res.stderr, (rule, res.stderr)
    # and the check can fail: one GPU more than a node has is refused
    res = subprocess.run([SBATCH, "--test-only", "-p", PARTITION, "--gpus=9", "--wrap", "true"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "not available" in res.stderr
    res = subprocess.run([SBATCH, "--test-only", "-p", PAPER_PARTITION, "--nodes=9", "--wrap", "true"],
                         capture_output=True, text=True, timeout=60)  # and a ninth node
    assert res.returncode != 0 and "not available" in res.stderr
    print(f"\n8-node training request: {trains[0]['args'][:400]} -> {trains[0]['out']}")
    print(f"\npaper study: {n} jobs, {sum(requests.values())} submitted to SLURM, {len(requests)} distinct requests "
          f"(rule, CPUs, GPUs, MB, min): {sorted(requests)}; {len(calls)} through the plugin, "
          f"{len(missing)} directly; all accepted")


@on_cluster
def test_multi_node_launch_line_runs_one_accelerate_launch_per_node(tmp_path):
    """The training job's multi-node line (stapo.core.launch) in a real 2-node SLURM job (sbatch on two of the paper
    nodes): srun starts one task per node, each runs `accelerate launch` (a stand-in recording its arguments) with
    its own machine rank, the first node's name as rendezvous and the job's port; node 1 drops the driver watch."""
    from stapo.core import launch

    record = tmp_path / "launches.log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_exe(bin_dir / "accelerate", f'#!/bin/sh\necho "$SLURM_NODEID|${{STAPO_DRIVER:-none}}|$*" >> {record}\n')
    line = launch.train_launcher(8, 2, "configs/accelerate/fsdp.yaml") + " train --recipe r.yaml --out runs/m/x"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "STAPO_DRIVER": "123:456"}
    res = subprocess.run([SBATCH, "--wait", "--parsable", "-p", PAPER_PARTITION, "--nodes=2", "--ntasks=2",
                          "--gpus=16", "-o", str(tmp_path / "job.out"), "--wrap", line],
                         env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr + (tmp_path / "job.out").read_text()
    job = int(res.stdout.strip().split(";")[0])
    runs = sorted(record.read_text().splitlines())
    port = launch.PORT_BASE + job % 20000
    common = ("launch --config_file configs/accelerate/fsdp.yaml --num_machines 2 --num_processes 16 "
              "--machine_rank {rank} --main_process_ip {first} --main_process_port {port} -m stapo.cli "
              "train --recipe r.yaml --out runs/m/x")
    shown = subprocess.run(["scontrol", "show", "job", str(job)], capture_output=True, text=True).stdout
    nodelist = re.search(r" NodeList=(\S+)", shown).group(1)
    hosts = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True).stdout
    first = hosts.split()[0]
    assert runs == [f"0|123:456|{common.format(rank=0, first=first, port=port)}",
                    f"1|none|{common.format(rank=1, first=first, port=port)}"], runs
    print(f"\n2-node SLURM job {job}: " + " // ".join(runs))
