"""``stapo plan``: what a study will cost before it starts: the DAG's job counts and GPU-hours per stage.

Jobs come from the workflow itself: ``snakemake --summary`` on the study's config files, run in a scratch
directory (so nothing of an existing study is read or touched), lists every output of the from-scratch DAG;
train and evaluate jobs are read off their output paths (``runs/<model>/<method>/final``,
``scores/<model>/<method>/<ckpt>/<benchmark>/<setting>.summary.json``). The recipe is the resolved config the
workflow resolves (first file, overlays deep-merged; stapo.study), so the estimate reads what the jobs read.

Cost model. Training (stapo.stage_model): the wall seconds of one rollout step, stage by stage as the paper's verl
runs it on the run's GPUs (``--gpu``, default the paper's H20): vLLM rollout to the last token of the longest
response (log-normal lengths, sequences in flight per GPU bounded by the KV cache), the old-policy (and KL reference)
forward, the update's FLOPs with attention and gradient-checkpointing recompute, gradient reduce-scatter and weight
sync at the topology, checkpoint writes; × max_steps (rollout batches, stapo.core.schedule). GPU-hours = wall ×
GPUs. The rates come from stapo/reference/rates.yaml, each with its source, the forward and decode ones calibrated
on verl's published DAPO step on 64 H20; ``benchmarks/gpu_check.py``'s measurements replace them (the update
utilisation from its update rate, the decode efficiency from a vLLM rollout rate only: an HF ``generate`` rate is
printed and not used). Evaluation, per job: problems · samples · E / eval_tps + engine_start_s · eval GPUs, the
eval rate (shipped: ``stapo/reference/throughputs.yaml``, an analytic estimate; or measured) scaled by reference /
model parameters.

The mean response R is not known before a run (it grows during RL): ``--response-tokens``, default the rates file's
``paper_response_mean`` (an assumption, printed); evaluation's E defaults to max_new_tokens / 3. Throughputs measured
on a CPU (``gpu_check.py --cpu-smoke``) are refused unless ``--allow-cpu-throughputs``. The paper's own statement of
its cost (64 H20 GPUs, 5-7 days per training run) and verl's anchor (modelled against published) print beside it.
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from stapo.core.fields import check_keys
from stapo.core.schedule import optimizer_steps_per_rollout

import yaml

from stapo import stage_model
from stapo.core import bounded
from stapo.core.atomic import atomic_write_json
from stapo.core.errors import UserError
from stapo.study import Study, load_files, parse, split_run
from stapo.study import snapshot_steps as study_snapshot_steps
from stapo.study.evaluation import Backend
from stapo.tasks.registry import ARITH_DEFAULTS, BENCHMARKS

__all__ = ["Jobs", "Throughputs", "MODEL_PARAMS_B", "workflow_jobs", "parse_summary", "load_throughputs",
           "estimate", "format_plan", "add_arguments", "run"]

# Parameters (billions) of the models the configs name, for scaling throughputs measured on another size.
MODEL_PARAMS_B = {
    "Qwen/Qwen3-1.7B-Base": 1.7, "Qwen/Qwen3-8B-Base": 8.2, "Qwen/Qwen3-14B-Base": 14.8,  # Qwen3 model cards
    "bundled:smollm2-135m-instruct": 0.135, "bundled:tiny-qwen3": 0.02,
}
TRAIN_RULES = ("train", "train_nodes")  # workflow/rules/train.smk: one node, several nodes
THROUGHPUT_KEYS = ("rollout_tokens_per_s", "train_tokens_per_s", "eval_tokens_per_s")
REFERENCE_THROUGHPUTS = Path(__file__).parent / "reference" / "throughputs.yaml"
# The paper's statement of its cost (Training Details): 64 H20 GPUs, 5-7 days per training run.
PAPER_COST = {"gpus": 64, "hardware": "H20", "days": (5, 7)}
PAPER_RUN_GPU_HOURS = tuple(PAPER_COST["gpus"] * 24 * d for d in PAPER_COST["days"])  # (7,680, 10,752)


@dataclass
class Jobs:
    """The DAG's jobs: train (model, run), evaluate (model, run, ckpt, benchmark, setting), other rules; a run is
    a method, or ``<method>/seed<k>`` in a study of several seeds (stapo.study.Study.runs)."""

    train: list[tuple[str, str]] = field(default_factory=list)
    evaluate: list[tuple[str, str, str, str, str]] = field(default_factory=list)
    other: Counter = field(default_factory=Counter)

    def counts(self) -> dict[str, int]:
        return {"train": len(self.train), "evaluate": len(self.evaluate), **self.other}


@dataclass
class Throughputs:
    """Per-GPU tokens/s measured on a reference model (``benchmarks/gpu_check.py`` writes this as YAML)."""

    reference_params_b: float | None = None
    rollout_tokens_per_s: float | None = None
    train_tokens_per_s: float | None = None
    eval_tokens_per_s: float | None = None
    engine_start_s: float = 60.0
    gpu: str | None = None
    device: str | None = None  # "cuda" or "cpu": where they were measured (gpu_check.py --cpu-smoke: cpu)
    measured: str | None = None  # the date gpu_check.py measured them (None: not measured by gpu_check)
    rollout_engine: str | None = None  # what generated the measured rollouts: vllm or hf (gpu_check --rollouts)
    rollout_completions: int = 64  # gpu_check's measured rollout: completions generated at once ...
    rollout_response_tokens: float = 512.0  # ... and their mean length (a random model runs to the cap)
    long_length: int | None = None  # gpu_check's long update probe: one sequence of this many tokens ...
    train_tokens_per_s_long: float | None = None  # ... and its update tokens/s (reported, not used in the estimate)
    models: dict = field(default_factory=dict)  # model key -> {<throughput key>: tokens/s} measured on that model
    provenance: dict = field(default_factory=dict)  # hardware, model, source, date, measured
    source: str = "command line"  # where these figures come from (set by load_throughputs)

    @property
    def on_cpu(self) -> bool:
        """Measured on a CPU (``device: cpu``, or gpu_check's ``gpu: cpu (smoke)``)."""
        return self.device == "cpu" or str(self.gpu or "").lower().startswith("cpu")

    @property
    def vllm_rollouts(self) -> bool:
        """The rollout rate was measured with vLLM (gpu_check's default), not HF ``generate``."""
        return Backend(self.rollout_engine or Backend.VLLM) is Backend.VLLM

    @property
    def origin(self) -> str:
        """Measured (when, on what, which rollout engine) or not, for the estimate's printout."""
        if self.measured:
            return (f"measured {self.measured} on {self.gpu or 'an unnamed device'} by benchmarks/gpu_check.py, "
                    f"rollouts {self.rollout_engine or 'vllm'}")
        if self.provenance.get("measured") is False:
            return f"not measured: {self.provenance.get('source', 'an estimate')}"
        return f"{self.gpu or 'GPU not named'}, origin not recorded"


# ------------------------------------------------------------------------------------------------------ jobs


def parse_summary(text: str) -> Jobs:
    """Jobs from ``snakemake --summary`` output (tab-separated: output_file, date, rule, ...)."""
    jobs, other = Jobs(), {}
    for line in text.splitlines()[1:]:
        cols = line.split("\t")
        if len(cols) < 3:
            continue
        path, rule = cols[0], cols[2]
        parts = path.split("/")
        if len(parts) in (5, 7) and parts[3].startswith("seed"):  # a run of a several-seed study: <method>/seed<k>
            parts = [*parts[:2], f"{parts[2]}/{parts[3]}", *parts[4:]]
        if rule in TRAIN_RULES and len(parts) == 4 and parts[0] == "runs":
            jobs.train.append((parts[1], parts[2]))
        elif rule == "evaluate" and path.endswith(".summary.json") and len(parts) == 6:
            jobs.evaluate.append((parts[1], parts[2], parts[3], parts[4], parts[5].removesuffix(".summary.json")))
        elif rule in ("recipe", "snapshot"):  # one small local job per recipe file / evaluation snapshot moved
            other[rule] = other.get(rule, 0) + 1
        elif rule not in (*TRAIN_RULES, "evaluate"):
            other[rule] = 1  # report-like rules: one job writing many files (no GPU)
    jobs.other = Counter(other)
    return jobs


def workflow_jobs(configfiles: list[str | Path], snakefile: str | Path = "Snakefile",
                  target: str = "results/table.md") -> tuple[Jobs, Study]:
    """(jobs, resolved study) of the from-scratch DAG for ``target``, built by the workflow in a scratch dir."""
    files = [Path(f).resolve() for f in configfiles]
    for f in files:
        if not f.is_file():
            raise UserError(f"--configfile: {f} not found")
    study = resolved_config(files)  # the one validation (a bad study: one line), before the DAG is built
    snakefile = Path(snakefile).resolve()
    if not snakefile.is_file():
        raise UserError(f"--snakefile: {snakefile} not found (run from the repository root)")
    snakemake = Path(sys.executable).with_name("snakemake")
    exe = [str(snakemake)] if snakemake.exists() else [sys.executable, "-m", "snakemake"]
    with tempfile.TemporaryDirectory(prefix="stapo-plan-") as scratch:
        cmd = [*exe, "-s", str(snakefile), "-d", scratch, "--configfile", *map(str, files), "--summary", target]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"snakemake --summary failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return parse_summary(proc.stdout), study


def resolved_config(files: list[Path]) -> Study:
    """The study as the workflow resolves it: the first file, later ones deep-merged over it (Snakemake's
    ``--configfile`` semantics), parsed by stapo.study."""
    return parse(load_files(files), source=", ".join(map(str, files)))


# ------------------------------------------------------------------------------------------------ throughputs


class PlanError(UserError, ValueError):
    """A bad ``stapo plan`` input; one line naming the file or flag."""


def load_throughputs(path: str | Path | None = None, *, allow_cpu: bool = False, **overrides) -> Throughputs:
    """Throughputs from a YAML/JSON file (gpu_check's output), then the non-None ``overrides`` (CLI flags).

    With neither a file nor the three rates given, the shipped reference (``REFERENCE_THROUGHPUTS``). Figures
    measured on a CPU raise PlanError unless ``allow_cpu``.
    """
    given = {k: v for k, v in overrides.items() if v is not None}
    source = f"--throughputs {path}" if path is not None else "command line"
    if path is None and "eval_tokens_per_s" not in given:
        path, source = REFERENCE_THROUGHPUTS, f"shipped reference ({REFERENCE_THROUGHPUTS.name}, not measured)"
    data = {}
    if path is not None:
        path = Path(path)
        if not path.exists():
            raise PlanError(f"--throughputs: {path} not found")
        try:
            data = bounded.load_yaml(path, what="a throughputs file") or {}
        except bounded.BadFile as err:
            raise PlanError(f"--throughputs: {err}") from None
        if not isinstance(data, dict):
            raise PlanError(f"--throughputs: {path}: expected a mapping of throughputs")
        try:
            check_keys(data, set(Throughputs.__dataclass_fields__) - {"source"}, str(path))
        except ValueError as err:
            raise PlanError(str(err)) from None
    data.update(given)
    tp = Throughputs(**data, source=source)
    if tp.on_cpu and not allow_cpu:
        raise PlanError(f"{source}: measured on a CPU ({tp.gpu or tp.device}); a GPU estimate from it is off by "
                        "orders of magnitude (pass --allow-cpu-throughputs to use it anyway)")
    return tp


def _params_b(study: Study, model: str, params: dict) -> float:
    spec = str(study.models[model].spec)
    value = params.get(model, MODEL_PARAMS_B.get(spec, MODEL_PARAMS_B.get(spec.partition("?")[0])))
    if value is None:
        raise ValueError(f"models.{model}: parameter count of {spec!r} unknown; give --params {model}=BILLIONS")
    return float(value)


def _rate(tp: Throughputs, key: str, model: str, params_b: float) -> float | None:
    """Tokens/s per GPU for ``model``: measured on it, else the reference figure scaled by parameters."""
    measured = (tp.models.get(model) or {}).get(key)
    if measured is not None:
        return float(measured)
    ref = getattr(tp, key)
    if ref is None:
        return None
    if tp.reference_params_b is None:
        raise ValueError(f"throughputs: {key} needs reference_params_b (the model size it was measured on)")
    return float(ref) * tp.reference_params_b / params_b


# --------------------------------------------------------------------------------------------------- estimate


def stage_rates(tp: Throughputs) -> stage_model.Rates:
    """The stage model's rates: the shipped ones (rates.yaml, calibrated on verl's anchor), with what ``tp`` measured
    or gave in their place: the update utilisation from ``train_tokens_per_s`` (forward + backward with
    recompute over the reference model's matmuls at the measuring GPU's peak), the decode efficiency from a vLLM
    ``rollout_tokens_per_s`` (against the modelled decode of the measured batch at efficiency 1). An HF rate is
    not a vLLM rate and is not used."""
    base = stage_model.rates()
    if tp.reference_params_b is None or tp.on_cpu:
        return base
    g = stage_model.gpu(tp.gpu or "H20")
    ref = stage_model.shape("", tp.reference_params_b)
    override, sources = {}, dict(base.sources)
    where = tp.origin if tp.measured else f"{tp.source}, {g.name}"
    if tp.train_tokens_per_s is not None:
        flops_per_token = 4 * 2 * tp.reference_params_b * 1e9  # forward, recomputed forward, backward
        override["update_utilization"] = tp.train_tokens_per_s * flops_per_token / (g.peak_tflops * 1e12)
        sources["update_utilization"] = f"{where}: update {tp.train_tokens_per_s:,.0f} tok/s on " \
                                        f"{tp.reference_params_b} B"
    if tp.rollout_tokens_per_s is not None and tp.vllm_rollouts:
        unit = dataclasses.replace(base, decode_efficiency=1.0)
        n, r = tp.rollout_completions, tp.rollout_response_tokens
        modelled = n * r / stage_model.decode_seconds([r] * n, 200.0, ref, g, 0.5, unit)
        override["decode_efficiency"] = tp.rollout_tokens_per_s / modelled
        sources["decode_efficiency"] = f"{where}: vLLM rollout {tp.rollout_tokens_per_s:,.0f} tok/s, {n} x {r:.0f}"
    return dataclasses.replace(base, **override, sources=sources)


def train_run_stages(study: Study, model: str, method: str, rates: stage_model.Rates, g: stage_model.Gpu,
                     params_b: float, prompt_tokens: float, response_tokens: float | None) -> dict[str, float]:
    """Wall seconds of one rollout step of the run, per stage (stapo.stage_model.step_stages)."""
    plan = study.plan(model, method)
    s, entry = plan.settings, study.models[model]
    k = optimizer_steps_per_rollout(s)  # optimiser steps per rollout batch
    forwards = int(k > 1) + int(plan.objective.kl_beta > 0)  # π_old, KL reference
    return stage_model.step_stages(
        stage_model.shape(str(entry.spec).partition("?")[0], params_b), g, rates, gpus=_gpus(study, model),
        nodes=entry.nodes, completions=s.prompts_per_generation * s.num_generations, prompt=prompt_tokens,
        mean_response=min(response_tokens or stage_model.paper_response_mean(), s.max_completion_length),
        cap=s.max_completion_length, sigma=stage_model.length_sigma(), optimizer_steps=k, forwards=forwards,
        checkpointing=s.gradient_checkpointing, save_steps=s.save_steps,
        memory_fraction=s.vllm_gpu_memory_utilization or stage_model.ROLLOUT_MEMORY)


def eval_job_seconds(study: Study, model: str, benchmark: str, tp: Throughputs, params_b: float,
                     eval_tokens: float | None) -> float | None:
    """GPU-seconds of one evaluation job: sampled tokens / eval throughput + engine start per GPU."""
    rate = _rate(tp, "eval_tokens_per_s", model, params_b)
    if rate is None:
        return None
    ev = study.eval
    bench = ev.benchmarks[benchmark]
    size = (bench.n or ARITH_DEFAULTS["n"]) if benchmark == "arith" else BENCHMARKS[benchmark].expected_rows[0]
    limit = bench.limit if bench.limit is not None else ev.limit
    problems = min(size, limit) if limit else size
    cap = bench.max_new_tokens or ev.max_new_tokens
    e = cap / 3 if eval_tokens is None else eval_tokens
    return problems * ev.samples(benchmark) * e / rate + tp.engine_start_s * _eval_gpus(study, model)


def _gpus(study: Study, model: str) -> int:
    return study.models[model].processes  # nodes x GPUs per node; a CPU job counts as one device


def _eval_gpus(study: Study, model: str) -> int:
    return max(study.models[model].eval_devices, 1)


def _hours(seconds: list[float | None]) -> float | None:
    return None if any(s is None for s in seconds) else sum(seconds) / 3600


def estimate(jobs: Jobs, study: Study, tp: Throughputs, *, prompt_tokens: float = 200.0,
             response_tokens: float | None = None, eval_tokens: float | None = None,
             params: dict | None = None, gpu: str = "H20") -> dict:
    """Per-model and per-stage GPU-hours of the study (None where an evaluation throughput was not given), the
    training stages of one rollout step per run, the rates with their sources and verl's anchor."""
    params, rates, g = params or {}, stage_rates(tp), stage_model.gpu(gpu)
    full = set(study.workflow.checkpoints)
    present = {m for m, _ in jobs.train} | {j[0] for j in jobs.evaluate}
    models = [m for m in study.models if m in present]  # the config's order (small to large in paper.yaml)
    per_model = {}
    for model in models:
        pb = _params_b(study, model, params)
        steps = {run: train_run_stages(study, model, split_run(run)[0], rates, g, pb, prompt_tokens, response_tokens)
                 for m, run in jobs.train if m == model}
        runs = {run: sum(st.values()) * study.plan(model, split_run(run)[0]).settings.max_steps * _gpus(study, model)
                for run, st in steps.items()}
        kinds: dict[str, list] = {"final": [], "base": [], "curve": []}
        for m, method, ckpt, bench, _ in jobs.evaluate:
            if m == model:
                kind = "base" if method == "base" else ("final" if ckpt in full else "curve")
                kinds[kind].append(eval_job_seconds(study, model, bench, tp, pb, eval_tokens))
        per_model[model] = {
            "params_b": pb, "gpus_per_run": _gpus(study, model), "nodes": study.models[model].nodes,
            "gpus_per_node": max(1, study.models[model].gpus), "eval_gpus": _eval_gpus(study, model),
            "train_runs": len(runs), "train_gpu_hours": _hours(list(runs.values())),
            "train_gpu_hours_per_run": {k: v / 3600 for k, v in runs.items()},
            "train_wall_days_per_run": {k: v / 3600 / 24 / _gpus(study, model) for k, v in runs.items()},
            "train_step_seconds": steps,
            "eval_jobs": {k: len(v) for k, v in kinds.items()},
            "eval_gpu_hours": {k: _hours(v) for k, v in kinds.items()},
            "peak_disk_per_run": {run: peak_disk_bytes(study, model, split_run(run)[0], pb) for run in runs},
        }
    stages = {"train": _hours([v["train_gpu_hours"] * 3600 for v in per_model.values()]),
              "evaluate": _hours([(h * 3600 if h is not None else None) for v in per_model.values()
                                  for h in v["eval_gpu_hours"].values()])}
    total = None if None in stages.values() else sum(stages.values())
    modelled, published, anchor_mean = stage_model.anchor_stages(rates)
    return {"jobs": jobs.counts(), "seeds": study.seeds, "models": per_model, "stages": stages,
            "total_gpu_hours": total, "gpu": g.name,
            "assumptions": {"prompt_tokens": prompt_tokens,
                            "response_tokens": response_tokens or stage_model.paper_response_mean(),
                            "response_length_sigma": stage_model.length_sigma(), "eval_tokens": eval_tokens or "max/3"},
            "rates": {**{k: v for k, v in dataclasses.asdict(rates).items() if k != "sources"},
                      "sources": rates.sources},
            "verl_anchor": {"modelled": modelled, "published": published, "mean_response": anchor_mean},
            "nemo_rl_anchor": dict(zip(("modelled", "published"), stage_model.nemo_check(rates))),
            "throughputs": {**asdict(tp), "on_cpu": tp.on_cpu, "origin": tp.origin, "vllm_rollouts": tp.vllm_rollouts},
            "paper_run_gpu_hours": list(PAPER_RUN_GPU_HOURS), "paper_run_days": list(PAPER_COST["days"])}


RESUME_BYTES_PER_PARAM = 12  # a resume checkpoint: fp32 weights (4) + AdamW's two fp32 moments (8)
FINAL_BYTES_PER_PARAM = 4  # final/: the fp32 master weights


def peak_disk_bytes(study: Study, model: str, method: str, params_b: float) -> dict:
    """Upper bound of one run's disk at its peak (stapo.train.rundir): while a resume checkpoint is written the
    previous ``save_total_limit`` stay (K + 1 of them), every evaluation snapshot exists until the evaluations that
    read it run (after training: Snakemake then deletes each), and final/."""
    settings = study.train_settings(model, method)
    keep = settings.save_total_limit or -(-settings.max_steps // settings.save_steps)  # null: every save kept
    snaps = len(study_snapshot_steps(study, model, method))
    per_param = 2 if settings.bf16 else 4  # the evaluation's dtype
    parts = {"resume": (keep + 1) * RESUME_BYTES_PER_PARAM, "snapshots": snaps * per_param,
             "final": FINAL_BYTES_PER_PARAM}
    return {"bytes": sum(parts.values()) * params_b * 1e9, "resume_kept": keep, "snapshots": snaps,
            "bytes_per_param": parts}


def disk_lines(plan: dict) -> list[str]:
    """Peak disk per run and for the study (every run at its peak at once: the upper bound)."""
    lines, total = [], 0.0
    for model, m in plan["models"].items():
        peaks = m.get("peak_disk_per_run") or {}
        total += sum(v["bytes"] for v in peaks.values())
        if peaks:
            run, v = max(peaks.items(), key=lambda item: item[1]["bytes"])  # the run that needs the most
            parts = ", ".join(f"{k} {b} B/param" for k, b in v["bytes_per_param"].items())
            lines.append(f"peak disk per run, {model}: {v['bytes'] / 1e12:,.2f} TB at most ({run}: "
                         f"{v['resume_kept']} resume checkpoint(s) + 1 being written, {v['snapshots']} evaluation "
                         f"snapshots, final; {parts})")
    if lines:
        lines.append(f"peak disk of the study, every run at its peak at once: {total / 1e12:,.1f} TB")
    return lines


def _fmt(hours: float | None) -> str:
    return "n/a" if hours is None else f"{hours:,.1f}"


def wall_days_lines(plan: dict) -> list[str]:
    """Wall-days per training run at each model's configured topology, beside the paper's, and the ratio."""
    lo, hi = plan.get("paper_run_days", PAPER_COST["days"])
    lines = ["", f"wall-days per training run at the configured topology on {plan.get('gpu', 'H20')} (stage model, "
                 "stapo.stage_model), and the ratio to the paper's:"]
    for model, m in plan["models"].items():
        days = list(m.get("train_wall_days_per_run", {}).values())
        topology = f"{m.get('nodes', 1)} node(s) x {m.get('gpus_per_node', m['gpus_per_run'])} GPUs"
        span = f"{min(days):,.1f}-{max(days):,.1f} days" if days else "n/a"
        ratio = f"  x{min(days) / hi:.2f}-x{max(days) / lo:.2f} the paper's" if days else ""
        lines.append(f"  {model:<20} {topology:<20} {span}{ratio}")
    lines.append(f"  {'paper':<20} {'8 node(s) x 8 GPUs':<20} {lo}-{hi} days ({PAPER_COST['gpus']} "
                 f"{PAPER_COST['hardware']})")
    return lines


def stage_lines(plan: dict) -> list[str]:
    """Seconds per rollout step by stage (each model's slowest run), the rates with their sources, verl's anchor."""
    lines = ["", "seconds per training step (rollout batch), the slowest run of each model:"]
    for model, m in plan["models"].items():
        if m.get("train_step_seconds"):
            run, st = max(m["train_step_seconds"].items(), key=lambda kv: sum(kv[1].values()))
            lines.append(f"  {model:<20} {run:<10} " + ", ".join(f"{k} {v:,.1f}" for k, v in st.items())
                         + f" = {sum(st.values()):,.0f} s")
    r = plan["rates"]
    lines.append("rates:")
    for key in ("update_utilization", "forward_utilization", "decode_efficiency", "decode_overhead_s",
                "checkpoint_gb_s"):
        source = r["sources"].get(key) or r["sources"].get(key.replace("_s", "_ms"), "")
        lines.append(f"  {key} {r[key]:.3g}: {' '.join(str(source).split())}")
    a = plan["verl_anchor"]
    lines.append(f"verl anchor (Qwen2.5-Math-7B DAPO, 64 H20, 512 x 16, fully_async.md), modelled / published s at "
                 f"its implied mean response {a['mean_response']:,.0f}: "
                 + ", ".join(f"{k} {a['modelled'][k]:,.1f} / {a['published'][k]:,.1f}"
                             for k in ("rollout", "old_log_prob", "update"))
                 + f", step {sum(a['modelled'].values()):,.1f} / {a['published']['step']:,.1f} (verl's step also "
                   "holds rewards, advantages and its own overheads)")
    n = plan["nemo_rl_anchor"]
    lines.append(f"NeMo-RL cross-check (Llama-3.1-8B GRPO, 16 H100, mean response 1,019): modelled step "
                 f"{n['modelled']:,.1f} s / published {n['published']:,.1f} s")
    return lines


def format_plan(plan: dict) -> str:
    """The human-readable table ``stapo plan`` prints."""
    counts = ", ".join(f"{k} {v}" for k, v in plan["jobs"].items())
    seeds = plan.get("seeds") or []
    lines = [f"jobs: {counts} (total {sum(plan['jobs'].values())})"
             + (f"; {len(seeds)} seeds {seeds}: each (model, method) trained and evaluated once per seed"
                if len(seeds) > 1 else ""),
             "", f"{'model':<20} {'stage':<16} {'jobs':>6} {'GPUs/job':>8} {'GPU-h':>12} {'wall-h/job':>11} "
                 f"{'GPU-h/run':>10}"]
    for model, m in plan["models"].items():
        per_run = [h for h in m["train_gpu_hours_per_run"].values() if h is not None]
        wall = f"{max(per_run) / m['gpus_per_run']:,.1f}" if per_run else "n/a"
        run = f"{min(per_run):,.0f}-{max(per_run):,.0f}" if per_run else "n/a"
        gpus = f"{m['nodes']}x{m['gpus_per_node']}" if m.get("nodes", 1) > 1 else m["gpus_per_run"]
        lines.append(f"{model:<20} {'train':<16} {m['train_runs']:>6} {gpus:>8} "
                     f"{_fmt(m['train_gpu_hours']):>12} {wall:>11} {run:>10}")
        for kind, n in m["eval_jobs"].items():
            if n:
                lines.append(f"{'':<20} {'eval ' + kind:<16} {n:>6} {m['eval_gpus']:>8} "
                             f"{_fmt(m['eval_gpu_hours'][kind]):>12} {'':>11}")
    st = plan["stages"]
    lines += ["", f"GPU-hours: train {_fmt(st['train'])}, evaluate {_fmt(st['evaluate'])}, "
                  f"total {_fmt(plan['total_gpu_hours'])}",
              "assumptions: " + ", ".join(f"{k} {v}" for k, v in plan["assumptions"].items())]
    lines += wall_days_lines(plan)
    lines += stage_lines(plan)
    lines += disk_lines(plan)
    tp = plan["throughputs"]
    ref = f"reference {tp['reference_params_b']} B" if tp.get("reference_params_b") else "per model"
    if tp.get("rollout_tokens_per_s") is not None and not tp.get("vllm_rollouts"):
        lines.append(f"rollout {tp['rollout_tokens_per_s']:,.0f} tok/s/GPU was measured with {tp['rollout_engine']} "
                     "generate, not vLLM: not used (the decode efficiency stays the calibrated one)")
    lines.append(f"throughputs ({tp.get('source', 'command line')}; {tp.get('gpu') or 'GPU not named'}, {ref}): "
                 + ", ".join(f"{k.removesuffix('_tokens_per_s')} {tp[k]:,.0f} tok/s/GPU" for k in THROUGHPUT_KEYS
                             if tp.get(k) is not None))
    lines.append(f"  {tp.get('origin', 'origin not recorded')}"
                 + (f"; update at {tp['long_length']:,} tokens (one sequence): {tp['train_tokens_per_s_long']:,.0f}"
                    " tok/s/GPU" if tp.get("train_tokens_per_s_long") else ""))
    if tp.get("on_cpu"):
        lines.append("WARNING: these throughputs were measured on a CPU: the GPU-hours above are not a GPU estimate")
    lo, hi = PAPER_RUN_GPU_HOURS
    lines.append(f"paper, for scale: {PAPER_COST['gpus']} {PAPER_COST['hardware']} GPUs x {PAPER_COST['days'][0]}-"
                 f"{PAPER_COST['days'][1]} days per training run = {lo:,}-{hi:,} GPU-hours per run")
    if tp["eval_tokens_per_s"] is None and not tp["models"]:
        lines.append("n/a: give --throughputs FILE (benchmarks/gpu_check.py writes one) or --eval-tps with "
                     "--reference-params")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------ CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--configfile", nargs="+", default=["configs/paper.yaml"],
                        help="study config file(s), merged as Snakemake does (default: configs/paper.yaml)")
    parser.add_argument("--snakefile", default="Snakefile", help="the workflow (default: ./Snakefile)")
    parser.add_argument("--target", default="results/table.md")
    parser.add_argument("--throughputs", help="YAML from benchmarks/gpu_check.py (per-GPU tokens/s)")
    parser.add_argument("--rollout-tps", type=float, help="vLLM rollout tokens/s per GPU (reference model)")
    parser.add_argument("--train-tps", type=float, help="policy update tokens/s per GPU (reference model)")
    parser.add_argument("--eval-tps", type=float, help="vLLM evaluation tokens/s per GPU (reference model)")
    parser.add_argument("--reference-params", type=float, help="billions of parameters of the reference model")
    parser.add_argument("--engine-start", type=float, help="seconds to start vLLM per evaluation job (default 60)")
    parser.add_argument("--prompt-tokens", type=float, default=200.0, help="mean prompt tokens (default 200)")
    parser.add_argument("--response-tokens", type=float, help="mean rollout tokens over a run (default: "
                        "paper_response_mean in stapo/reference/rates.yaml, an assumption)")
    parser.add_argument("--eval-tokens", type=float, help="mean evaluation tokens per sample (default max_new/3)")
    parser.add_argument("--params", nargs="*", default=[], metavar="MODEL=B", help="parameters (billions) per model")
    parser.add_argument("--allow-cpu-throughputs", action="store_true",
                        help="accept throughputs measured on a CPU (gpu_check.py --cpu-smoke) for the estimate")
    parser.add_argument("--gpu", default="H20", help="the training GPU the stage model runs on (H20, the paper's; "
                        "H100, H200: stapo/reference/rates.yaml)")
    parser.add_argument("--json", help="also write the estimate as JSON here")


def _parse_params(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            out[key] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise ValueError(f"--params: expected MODEL=BILLIONS, got {item!r}")
    return out


def run(args: argparse.Namespace) -> int:
    try:  # the options first: a bad one is one line, before the DAG is built
        params = _parse_params(args.params)
        tp = load_throughputs(args.throughputs, rollout_tokens_per_s=args.rollout_tps,
                              train_tokens_per_s=args.train_tps, eval_tokens_per_s=args.eval_tps,
                              reference_params_b=args.reference_params, engine_start_s=args.engine_start,
                              allow_cpu=args.allow_cpu_throughputs)
    except (ValueError, OSError, yaml.YAMLError) as err:
        raise UserError(" ".join(str(err).split())) from None
    jobs, study = workflow_jobs(args.configfile, args.snakefile, args.target)
    try:
        plan = estimate(jobs, study, tp, prompt_tokens=args.prompt_tokens, response_tokens=args.response_tokens,
                        eval_tokens=args.eval_tokens, params=params, gpu=args.gpu)
    except ValueError as err:  # a model whose size is unknown (--params)
        raise UserError(str(err)) from None
    print(format_plan(plan))
    if args.json:
        atomic_write_json(args.json, plan)
    return 0
