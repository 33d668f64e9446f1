"""stapo plan: the workflow's own job counts and the GPU-hour arithmetic, checked against hand-computed numbers."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from stapo.core.errors import UserError

import stapo.plan as P

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "configs" / "paper.yaml"
TINY = ROOT / "configs" / "tiny.yaml"


@pytest.fixture(scope="module")
def paper():
    return P.workflow_jobs([PAPER], ROOT / "Snakefile")


def test_paper_job_counts_come_from_the_dag(paper):
    jobs, config = paper
    # 3 models x 4 methods; per model: (4 methods + base) x 6 benchmarks x 2 settings = 60 full evaluations,
    # plus AIME24 at t1.0_p1.0 for checkpoint-20 .. checkpoint-2980 (149 checkpoints) x 4 methods = 596 curve jobs
    # plus one small job per distinct job recipe (12 train, 6 benchmarks x 2 settings, the report) and study.yaml
    # and one local job per curve checkpoint moving its evaluation snapshot out of the run (rule snapshot)
    assert jobs.counts() == {"train": 12, "evaluate": 3 * (60 + 596), "report": 1, "recipe": 25, "study_file": 1,
                             "snapshot": 3 * 596}
    assert ("qwen3-8b-base", "stapo") in jobs.train
    # eval_every counts training (rollout) steps; checkpoint-N is named by optimiser step: 4 x 2980
    assert ("qwen3-8b-base", "stapo", "checkpoint-11920", "aime24", "t1.0_p1.0") in jobs.evaluate
    assert config.plan("qwen3-8b-base", "stapo").settings.max_steps == 3000  # the resolved study


def test_overlay_config_changes_the_dag(tmp_path):
    fast = tmp_path / "fast.yaml"
    fast.write_text("workflow: {eval_every: null, models: [qwen3-1.7b-base]}\n")
    jobs, _ = P.workflow_jobs([PAPER, fast], ROOT / "Snakefile")
    assert jobs.counts() == {"train": 4, "evaluate": 60, "report": 1, "recipe": 4 + 12 + 1, "study_file": 1}


def test_paper_gpu_hours_from_the_stage_model(paper):
    """Training GPU-hours = Σ stage seconds per rollout step x max_steps x GPUs; evaluation = tokens / eval rate +
    engine start (unchanged). The stages by hand for 1.7B JustRL on 64 H20 at mean response 2,000."""
    from stapo import stage_model as M

    jobs, config = paper
    tp = P.Throughputs(reference_params_b=1.7, eval_tokens_per_s=20_000, engine_start_s=60)
    plan = P.estimate(jobs, config, tp, prompt_tokens=200)
    m = plan["models"]["qwen3-1.7b-base"]
    st = m["train_step_seconds"]["justrl"]
    r = M.rates()
    seqs = [200 + x for x in M.lengths(2000, 15360, 512, 1.0)]
    tokens, tokens_sq = 4 * sum(seqs), 4 * sum(x * x for x in seqs)  # 2048 completions = 4 x the 512 quantiles
    flops = 2 * 1.72e9 * tokens + 4 * tokens_sq * 16 * 128 * 28  # one forward
    assert st["update"] == pytest.approx(4 * flops / (64 * 148e12 * 0.31))  # forward, recompute, backward
    assert st["old_log_prob"] == pytest.approx(flops / (64 * 148e12 * r.forward_utilization))  # 4 steps: π_old
    assert st["grad_sync"] == pytest.approx(4 * 4 * 1.72e9 * 63 / 64 / 50e9)  # 4 optimiser steps, fp32, network
    assert st["checkpoint"] == pytest.approx(12 * 1.72e9 / (8 * 2e9) / 20)
    assert m["train_gpu_hours_per_run"]["justrl"] == pytest.approx(sum(st.values()) * 3000 * 64 / 3600)
    assert m["train_wall_days_per_run"]["justrl"] == pytest.approx(sum(st.values()) * 3000 / 86400)
    grpo = m["train_step_seconds"]["grpo"]  # a KL reference: a second forward
    assert grpo["old_log_prob"] == pytest.approx(2 * st["old_log_prob"])
    # the rollout waits for the batch's longest response, here the 15,360-token budget (~e^3.3 x the median)
    assert M.batch_max(2000, 15360, 2048, 1.0) == 15360 and st["rollout"] > 15360 * 2 * 1.72e9 / 4e12
    assert 3.5 < m["train_wall_days_per_run"]["justrl"] < 4.0  # measured 3.72 (the paper: 5-7 days)
    # evaluation of one 1.7B final checkpoint: AIME24 30 x 32 samples of 20480 / 3 tokens + 60 s engine start
    aime = (30 * 32 * 20480 / 3 / 20_000 + 60) / 3600
    six = sum(p * s * 20480 / 3 / 20_000 + 60 for p, s in
              [(30, 32), (30, 32), (40, 32), (500, 4), (272, 4), (674, 4)]) / 3600
    assert m["eval_jobs"] == {"final": 48, "base": 12, "curve": 596}
    assert m["eval_gpu_hours"]["final"] == pytest.approx(4 * 2 * six)
    assert m["eval_gpu_hours"]["curve"] == pytest.approx(596 * aime)
    assert plan["total_gpu_hours"] == pytest.approx(plan["stages"]["train"] + plan["stages"]["evaluate"])


def test_calibration_reproduces_verls_anchor_and_sources_every_rate(paper):
    """The forward utilisation and decode efficiency are fitted to verl's DAPO step on 64 H20 (fully_async.md:
    gen 150.72, old_log_prob 70.26, update 133.41 s) at the mean response its update time implies (612 tokens at
    utilisation 0.31); NeMo-RL's Llama-3.1-8B step on 16 H100 (92.8 s) is predicted within 10 %."""
    from stapo import stage_model as M

    r = M.rates()
    modelled, published, mean = M.anchor_stages(r)
    for key in ("rollout", "old_log_prob", "update"):
        assert modelled[key] == pytest.approx(published[key], rel=1e-3)
    assert 600 < mean < 625 and 0.14 < r.forward_utilization < 0.155 and 0.5 < r.decode_efficiency < 0.6
    nemo, published_step = M.nemo_check(r)
    assert published_step == 92.8 and nemo == pytest.approx(92.8, rel=0.1)
    data = yaml.safe_load(M.RATES.read_text())
    for name, rate in data["rates"].items():
        assert rate["source"] and ("quote" in rate or rate["source"].startswith("assumed")), name
    assert "b178a3cd" in data["rates"]["verl_anchor"]["source"] and "365.28" in data["rates"]["verl_anchor"]["quote"]
    assert "1,581" in data["rates"]["nemo_rl_anchor"]["quote"]


def test_update_flops_are_the_trainers(paper):
    """The stage model's update FLOPs without recompute are stapo.train.step_cost.update_flops (verl's
    FlopsCounter): 6N·T + 12·ΣL²·heads·head_dim·layers."""
    from stapo import stage_model as M
    from stapo.train.step_cost import update_flops

    sh = M.shape("Qwen/Qwen3-8B-Base")
    trainer = update_flops({"params": sh.params_b * 1e9, "heads": sh.heads, "head_dim": sh.head_dim,
                            "layers": sh.layers}, 1e6, 3e9)
    assert M._flops(sh, 1e6, 3e9, 3) == pytest.approx(trainer)


def test_measured_rates_replace_the_shipped_ones_and_hf_rollouts_do_not():
    """gpu_check's update rate becomes the update utilisation (8N FLOPs per token at the measuring GPU's peak); its
    vLLM rollout rate the decode efficiency; an HF generate rate is printed and not used."""
    shipped = P.stage_rates(P.Throughputs())
    tp = P.Throughputs(reference_params_b=1.7, train_tokens_per_s=9000, rollout_tokens_per_s=2000, gpu="NVIDIA H200",
                       measured="2026-12-05", rollout_engine="vllm")
    r = P.stage_rates(tp)
    assert r.update_utilization == pytest.approx(9000 * 8 * 1.7e9 / 989e12)
    assert r.decode_efficiency != shipped.decode_efficiency and "measured 2026-12-05" in r.sources["decode_efficiency"]
    hf = P.stage_rates(P.Throughputs(**{**dataclasses.asdict(tp), "rollout_engine": "hf", "source": "x"}))
    assert hf.decode_efficiency == shipped.decode_efficiency and hf.update_utilization == r.update_utilization


def test_tiny_study_counts(tmp_path):
    jobs, config = P.workflow_jobs([TINY], ROOT / "Snakefile")
    # offline miniature: smollm2 only, arith only: (4 methods + base) x 2 settings
    assert jobs.counts() == {"train": 4, "evaluate": 10, "report": 1, "recipe": 4 + 2 + 1, "study_file": 1}
    plan = P.estimate(jobs, config, P.Throughputs(reference_params_b=0.135, rollout_tokens_per_s=100,
                                                  train_tokens_per_s=100, eval_tokens_per_s=100, engine_start_s=0))
    # arith: limit 48 problems x 1 sample x 64 / 3 tokens at 100 tok/s
    assert plan["models"]["smollm2-135m"]["eval_gpu_hours"]["final"] == pytest.approx(8 * 48 * 64 / 3 / 100 / 3600)


def test_errors_name_the_fix(paper, tmp_path):
    jobs, config = paper
    models = {**config.models, "qwen3-8b-base": dataclasses.replace(config.models["qwen3-8b-base"],
                                                                      spec="org/unknown-7b")}
    config = dataclasses.replace(config, models=models)
    tp = P.Throughputs(reference_params_b=1.7, rollout_tokens_per_s=1, train_tokens_per_s=1, eval_tokens_per_s=1)
    with pytest.raises(ValueError, match=r"models\.qwen3-8b-base: parameter count of 'org/unknown-7b' unknown; "
                                         r"give --params qwen3-8b-base=BILLIONS"):
        P.estimate(jobs, config, tp)
    assert P.estimate(jobs, config, tp, params={"qwen3-8b-base": 7.0})["models"]["qwen3-8b-base"]["params_b"] == 7.0
    with pytest.raises(ValueError, match="eval_tokens_per_s needs reference_params_b"):
        P.estimate(jobs, config, P.Throughputs(eval_tokens_per_s=1))
    bad = tmp_path / "tp.yaml"
    bad.write_text("rollout_tps: 3\n")
    with pytest.raises(ValueError, match=r"rollout_tps: unknown key"):
        P.load_throughputs(bad)
    with pytest.raises(UserError, match="--configfile"):  # one line from the CLI, before the DAG is built
        P.workflow_jobs([tmp_path / "nope.yaml"], ROOT / "Snakefile")


def test_cli_prints_table_and_writes_json(tmp_path, capsys, monkeypatch):
    from stapo.cli import main

    tp = tmp_path / "tp.yaml"
    tp.write_text("reference_params_b: 1.7\nrollout_tokens_per_s: 10000\ntrain_tokens_per_s: 5000\n"
                  "eval_tokens_per_s: 20000\ngpu: NVIDIA H200\n")
    monkeypatch.chdir(ROOT)
    out = tmp_path / "plan.json"
    assert main(["plan", "--throughputs", str(tp), "--train-tps", "2500", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "jobs: train 12, evaluate 1968, report 1, recipe 25, snapshot 1788, study_file 1 (total 3795)" in text
    plan = json.loads(out.read_text())
    assert plan["throughputs"]["train_tokens_per_s"] == 2500  # the flag overrides the file
    assert plan["rates"]["update_utilization"] == pytest.approx(2500 * 8 * 1.7e9 / 989e12)  # H200's peak
    assert "command line" not in text and "--throughputs" in plan["rates"]["sources"]["update_utilization"]


def test_out_of_the_box_uses_the_shipped_reference_and_says_so(tmp_path, capsys, monkeypatch):
    from stapo.cli import main

    ref = yaml.safe_load(P.REFERENCE_THROUGHPUTS.read_text())
    assert ref["provenance"]["measured"] is False and {"hardware", "source", "date"} <= set(ref["provenance"])
    tp = P.load_throughputs()
    assert (tp.eval_tokens_per_s, tp.train_tokens_per_s, tp.rollout_tokens_per_s) == (3000.0, None, None)
    assert "shipped reference" in tp.source and not tp.on_cpu
    monkeypatch.chdir(ROOT)
    out = tmp_path / "plan.json"
    assert main(["plan", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "n/a" not in text and "shipped reference (throughputs.yaml, not measured)" in text
    assert "64 H20 GPUs x 5-7 days per training run = 7,680-10,752 GPU-hours per run" in text
    assert "update_utilization 0.31: volcengine/verl @ b178a3cd, docs/perf/dpsk.md" in text
    assert "decode_efficiency 0.553: calibrated: verl anchor gen 150.72 s" in text
    assert "rollout 150.7 / 150.7, old_log_prob 70.3 / 70.3, update 133.4 / 133.4" in text
    plan = json.loads(out.read_text())
    days = {m: v["train_wall_days_per_run"] for m, v in plan["models"].items()}
    # measured (2026-12-08): JustRL/STAPO 3.7 / 11.0 / 18.7 days at 1.7B / 8B / 14B, the paper 5-7 for all
    assert [round(days[m]["justrl"], 1) for m in days] == [3.7, 11.0, 18.7]
    assert days["qwen3-8b-base"]["stapo"] == days["qwen3-8b-base"]["justrl"] < days["qwen3-8b-base"]["grpo"]
    assert plan["paper_run_gpu_hours"] == [7680, 10752]


def test_cpu_throughputs_are_refused_for_a_gpu_estimate(tmp_path, capsys, monkeypatch):
    from stapo.cli import main

    smoke = tmp_path / "throughputs.yaml"  # what gpu_check.py --cpu-smoke writes
    smoke.write_text("gpu: cpu (smoke)\nreference_params_b: 0.02\nrollout_tokens_per_s: 40\n"
                     "train_tokens_per_s: 200\neval_tokens_per_s: 60\nengine_start_s: 20\n")
    with pytest.raises(P.PlanError, match=r"measured on a CPU \(cpu \(smoke\)\).*--allow-cpu-throughputs"):
        P.load_throughputs(smoke)
    monkeypatch.chdir(ROOT)
    assert main(["plan", "--throughputs", str(smoke)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "measured on a CPU" in line
    assert main(["plan", "--throughputs", str(smoke), "--allow-cpu-throughputs"]) == 0
    assert "WARNING: these throughputs were measured on a CPU" in capsys.readouterr().out


def test_seeds_multiply_training_and_its_evaluations(tmp_path):
    """workflow.seeds: [0, 1, 2] on the miniature: 12 training jobs (4 methods x 3 seeds), each seed's final
    evaluated, the untrained model once; GPU-hours of training and of trained-model evaluation triple."""
    seeds = tmp_path / "seeds.yaml"
    seeds.write_text("workflow: {seeds: [0, 1, 2]}\n")
    one, study1 = P.workflow_jobs([TINY], ROOT / "Snakefile")
    three, study3 = P.workflow_jobs([TINY, seeds], ROOT / "Snakefile")
    assert study3.seeds == [0, 1, 2] and study1.seeds == [0]
    # (4 methods x 3 seeds + base) x 2 settings; the recipes are shared by the seeds (--seed k on the command)
    assert three.counts() == {"train": 12, "evaluate": 26, "report": 1, "recipe": 4 + 2 + 1, "study_file": 1}
    assert ("smollm2-135m", "stapo/seed2") in three.train and ("smollm2-135m", "stapo") in one.train
    assert ("smollm2-135m", "justrl/seed1", "final", "arith", "t0.7_p0.9") in three.evaluate
    assert ("smollm2-135m", "base", "base", "arith", "t1.0_p1.0") in three.evaluate
    tp = P.Throughputs(reference_params_b=0.135, rollout_tokens_per_s=100, train_tokens_per_s=100,
                       eval_tokens_per_s=100, engine_start_s=0)
    p1, p3 = P.estimate(one, study1, tp), P.estimate(three, study3, tp)
    m1, m3 = p1["models"]["smollm2-135m"], p3["models"]["smollm2-135m"]
    assert m3["train_runs"] == 12 and m3["train_gpu_hours"] == pytest.approx(3 * m1["train_gpu_hours"])
    assert m3["eval_gpu_hours"]["final"] == pytest.approx(3 * m1["eval_gpu_hours"]["final"])
    assert m3["eval_gpu_hours"]["base"] == pytest.approx(m1["eval_gpu_hours"]["base"])
    assert "3 seeds [0, 1, 2]" in P.format_plan(p3) and "seeds" not in P.format_plan(p1).splitlines()[0]


def test_seeds_must_be_distinct(tmp_path):
    seeds = tmp_path / "seeds.yaml"
    seeds.write_text("workflow: {seeds: [0, 1, 1]}\n")
    with pytest.raises(UserError, match=r"workflow\.seeds: \[0, 1, 1\] repeats a seed"):
        P.workflow_jobs([TINY, seeds], ROOT / "Snakefile")


def test_wall_days_at_the_configured_topology_and_measured_throughputs(tmp_path, capsys, monkeypatch):
    """configs/paper.yaml trains on 8 nodes x 8 GPUs: wall-days per run = GPU-hours / 64 / 24, printed beside the
    paper's 5-7 days; one node (an overlay) takes 7-8 times as long. Throughputs from gpu_check say when, on what and
    with which rollout engine they were measured."""
    from stapo.cli import main

    tp = tmp_path / "throughputs.yaml"  # what benchmarks/gpu_check.py --rollouts hf writes
    tp.write_text("gpu: NVIDIA H200\ndevice: cuda\nmeasured: '2026-12-05'\nrollout_engine: hf\n"
                  "reference_params_b: 1.7\nrollout_tokens_per_s: 900\ntrain_tokens_per_s: 1800\n"
                  "long_length: 8192\ntrain_tokens_per_s_long: 4100\neval_tokens_per_s: 3000\n")
    one_node = tmp_path / "one-node.yaml"
    one_node.write_text("models: {qwen3-8b-base: {nodes: 1}}\n")
    monkeypatch.chdir(ROOT)
    plans = {}
    for name, files in (("paper", [str(PAPER)]), ("one-node", [str(PAPER), str(one_node)])):
        assert main(["plan", "--throughputs", str(tp), "--configfile", *files, "--json", str(tmp_path / name)]) == 0
        plans[name] = (json.loads((tmp_path / name).read_text()), capsys.readouterr().out)
    plan, text = plans["paper"]
    m = plan["models"]["qwen3-8b-base"]
    assert (m["nodes"], m["gpus_per_node"], m["gpus_per_run"]) == (8, 8, 64)
    days = m["train_wall_days_per_run"]
    for run, hours in m["train_gpu_hours_per_run"].items():
        assert days[run] == pytest.approx(hours / 64 / 24)
    assert f"qwen3-8b-base        8 node(s) x 8 GPUs   {min(days.values()):,.1f}-{max(days.values()):,.1f} days" in text
    print({k: round(v, 2) for k, v in days.items()})
    assert "paper                8 node(s) x 8 GPUs   5-7 days (64 H20)" in text
    assert "measured 2026-12-05 on NVIDIA H200 by benchmarks/gpu_check.py, rollouts hf" in text
    assert "update at 8,192 tokens (one sequence): 4,100 tok/s/GPU" in text
    single = plans["one-node"][0]["models"]["qwen3-8b-base"]
    assert single["gpus_per_run"] == 8
    # one node: 8 times the work per GPU, less the inter-node gradient traffic (NVLink) and a shorter wait for the
    # batch's longest response per GPU than 8 sequential ones: measured 7.36x
    assert 7 * days["stapo"] < single["train_wall_days_per_run"]["stapo"] < 8 * days["stapo"]
    # gpu_check's update rate (1,800 tok/s on 1.7B, ~2.5 % of the H200's peak) replaces verl's 0.31; its HF rollout
    # rate is not a vLLM one and is not used
    assert plan["rates"]["update_utilization"] == pytest.approx(1800 * 8 * 1.7e9 / 989e12)
    assert "rollout 900 tok/s/GPU was measured with hf generate, not vLLM: not used" in text


def test_peak_disk_per_run_and_study(paper):
    """configs/paper.yaml: one resume checkpoint kept (+ the one being written: 2 x 12 B/param, fp32 weights and
    AdamW moments), 149 bf16 evaluation snapshots (2 B/param each, until evaluated), final (fp32, 4 B/param)."""
    jobs, config = paper
    plan = P.estimate(jobs, config, P.Throughputs(reference_params_b=1.7, eval_tokens_per_s=20_000))
    for model, m in plan["models"].items():
        for run, disk in m["peak_disk_per_run"].items():
            assert disk["resume_kept"] == 1 and disk["snapshots"] == 149, (model, run)
            assert disk["bytes"] == pytest.approx((2 * 12 + 149 * 2 + 4) * m["params_b"] * 1e9)
    text = P.format_plan(plan)
    line = next(t for t in text.splitlines() if t.startswith("peak disk per run, qwen3-14b-base"))
    assert f"{326 * plan['models']['qwen3-14b-base']['params_b'] / 1e3:,.2f} TB" in line
    total = sum(d["bytes"] for m in plan["models"].values() for d in m["peak_disk_per_run"].values())
    assert f"every run at its peak at once: {total / 1e12:,.1f} TB" in text
