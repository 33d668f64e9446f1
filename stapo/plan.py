"""``stapo plan``: what a study will cost before it starts: the DAG's job counts and GPU-hours per stage.

Jobs come from the workflow itself: ``snakemake --summary`` on the study's config files, run in a scratch
directory (so nothing of an existing study is read or touched), lists every output of the from-scratch DAG;
train and evaluate jobs are read off their output paths (``runs/<model>/<method>/final``,
``scores/<model>/<method>/<ckpt>/<benchmark>/<setting>.summary.json``). The recipe is the resolved config the
workflow resolves (first file, overlays deep-merged; stapo.study), so the estimate reads what the jobs read.

Cost model (GPU-seconds; throughputs are per GPU and, unless given per model, measured on a reference model of
``reference_params_b`` billion parameters and scaled by reference / model parameters, as FLOPs per token are):

    train, per (model, method) run:  max_steps · [G·R / rollout_tps + G·I·(P + R) / train_tps · k]
        max_steps counts training steps = rollout batches (stapo.core.schedule), G = prompts_per_generation ·
        num_generations completions per rollout batch, I = num_iterations, R = mean response tokens,
        P = mean prompt tokens, train_tps = policy forward + backward tokens/s; k = 1 + 1/3 per extra forward
        pass over the tokens (a forward is ~1/3 of forward + backward): the reference model's when the method
        has a KL term, and the old policy's (TRL's old_per_token_logps) when one rollout batch feeds several
        optimiser steps (prompts_per_generation / prompts_per_step · num_iterations > 1; the paper: 4);
    evaluate, per job:  problems · samples · E / eval_tps + engine_start_s · eval GPUs
        E = mean generated tokens per sample, problems = the benchmark's size (or its limit).

R and E are not known before a run (they grow during RL); the defaults assume a third of the length budget
(max_completion_length / 3, max_new_tokens / 3) and are printed with the estimate. ``benchmarks/gpu_check.py``
measures the throughputs on one GPU and writes a file for ``--throughputs``; without one, the shipped reference
(``stapo/reference/throughputs.yaml``: an analytic estimate for the paper's H20, provenance inside) is used and the
output says so. Throughputs measured on a CPU (``gpu_check.py --cpu-smoke``) are refused unless
``--allow-cpu-throughputs``: a GPU estimate from them is off by orders of magnitude. The paper's own statement of
its cost (64 H20 GPUs, 5-7 days per training run) is printed beside the estimate for scale.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from stapo.core.fields import check_keys

import yaml

from stapo.core.atomic import atomic_write_json
from stapo.core.errors import UserError
from stapo.study import Study, load, parse, split_run
from stapo.tasks.registry import ARITH_DEFAULTS, BENCHMARKS

__all__ = ["Jobs", "Throughputs", "MODEL_PARAMS_B", "workflow_jobs", "parse_summary", "load_throughputs",
           "estimate", "format_plan", "add_arguments", "run"]

# Parameters (billions) of the models the configs name, for scaling throughputs measured on another size.
MODEL_PARAMS_B = {
    "Qwen/Qwen3-1.7B-Base": 1.7, "Qwen/Qwen3-8B-Base": 8.2, "Qwen/Qwen3-14B-Base": 14.8,  # Qwen3 model cards
    "bundled:smollm2-135m-instruct": 0.135, "bundled:tiny-qwen3": 0.02,
}
EXTRA_FORWARD = 1.0 / 3.0  # forward+backward ≈ 3 forwards: one more forward pass adds a third
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
        elif rule == "recipe":  # one small job per distinct job recipe (results/recipes/<digest>.yaml)
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
    from snakemake.utils import update_config

    config = load(files[0])
    for extra in files[1:]:
        update_config(config, load(extra))
    return parse(config, source=", ".join(map(str, files)))


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
    if path is None and not set(THROUGHPUT_KEYS) <= set(given):
        path, source = REFERENCE_THROUGHPUTS, f"shipped reference ({REFERENCE_THROUGHPUTS.name}, not measured)"
    data = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise PlanError(f"--throughputs: {path} not found")
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as err:
            raise PlanError(f"--throughputs: {path}: not YAML ({str(err).splitlines()[0]})") from None
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


def train_run_seconds(study: Study, model: str, method: str, tp: Throughputs, params_b: float,
                      prompt_tokens: float, response_tokens: float | None) -> float | None:
    """GPU-seconds of one training run (module docstring); None when a throughput is missing."""
    plan = study.plan(model, method)
    s = plan.settings
    rollout = _rate(tp, "rollout_tokens_per_s", model, params_b)
    update = _rate(tp, "train_tokens_per_s", model, params_b)
    if rollout is None or update is None:
        return None
    r = s.max_completion_length / 3 if response_tokens is None else response_tokens
    g = s.prompts_per_generation * s.num_generations  # completions per training step (rollout batch)
    epochs = s.num_iterations
    old_logps = s.prompts_per_generation // s.prompts_per_step * epochs > 1
    k = 1.0 + EXTRA_FORWARD * (int(plan.objective.kl_beta > 0) + int(old_logps))
    return s.max_steps * (g * r / rollout + g * epochs * (prompt_tokens + r) / update * k)


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
             params: dict | None = None) -> dict:
    """Per-model and per-stage GPU-hours of the study (None where a throughput was not given)."""
    params = params or {}
    full = set(study.workflow.checkpoints)
    present = {m for m, _ in jobs.train} | {j[0] for j in jobs.evaluate}
    models = [m for m in study.models if m in present]  # the config's order (small to large in paper.yaml)
    per_model = {}
    for model in models:
        pb = _params_b(study, model, params)
        runs = {run: train_run_seconds(study, model, split_run(run)[0], tp, pb, prompt_tokens, response_tokens)
                for m, run in jobs.train if m == model}
        kinds: dict[str, list] = {"final": [], "base": [], "curve": []}
        for m, method, ckpt, bench, _ in jobs.evaluate:
            if m == model:
                kind = "base" if method == "base" else ("final" if ckpt in full else "curve")
                kinds[kind].append(eval_job_seconds(study, model, bench, tp, pb, eval_tokens))
        train_h = _hours(list(runs.values()))
        per_model[model] = {
            "params_b": pb, "gpus_per_run": _gpus(study, model), "nodes": study.models[model].nodes,
            "gpus_per_node": max(1, study.models[model].gpus), "eval_gpus": _eval_gpus(study, model),
            "train_runs": len(runs), "train_gpu_hours": train_h,
            "train_gpu_hours_per_run": {k: (v / 3600 if v is not None else None) for k, v in runs.items()},
            "train_wall_days_per_run": {k: (v / 3600 / 24 / _gpus(study, model) if v is not None else None)
                                        for k, v in runs.items()},
            "eval_jobs": {k: len(v) for k, v in kinds.items()},
            "eval_gpu_hours": {k: _hours(v) for k, v in kinds.items()},
        }
    stages = {"train": _hours([(v["train_gpu_hours"] * 3600 if v["train_gpu_hours"] is not None else None)
                               for v in per_model.values()]),
              "evaluate": _hours([(h * 3600 if h is not None else None) for v in per_model.values()
                                  for h in v["eval_gpu_hours"].values()])}
    total = None if None in stages.values() else sum(stages.values())
    return {"jobs": jobs.counts(), "seeds": study.seeds, "models": per_model, "stages": stages,
            "total_gpu_hours": total,
            "assumptions": {"prompt_tokens": prompt_tokens, "response_tokens": response_tokens or "max/3",
                            "eval_tokens": eval_tokens or "max/3", "extra_forward_cost": round(EXTRA_FORWARD, 3)},
            "throughputs": {**asdict(tp), "on_cpu": tp.on_cpu, "origin": tp.origin},
            "paper_run_gpu_hours": list(PAPER_RUN_GPU_HOURS), "paper_run_days": list(PAPER_COST["days"])}


def _fmt(hours: float | None) -> str:
    return "n/a" if hours is None else f"{hours:,.1f}"


def wall_days_lines(plan: dict) -> list[str]:
    """Wall-days per training run at each model's configured topology, beside the paper's."""
    lines = ["", "wall-days per training run at the configured topology (GPU-hours / GPUs: linear scaling over "
                 "nodes assumed, communication not modelled):"]
    for model, m in plan["models"].items():
        days = [d for d in m.get("train_wall_days_per_run", {}).values() if d is not None]
        topology = f"{m.get('nodes', 1)} node(s) x {m.get('gpus_per_node', m['gpus_per_run'])} GPUs"
        span = f"{min(days):,.1f}-{max(days):,.1f} days" if days else "n/a"
        lines.append(f"  {model:<20} {topology:<20} {span}")
    lo, hi = plan.get("paper_run_days", PAPER_COST["days"])
    lines.append(f"  {'paper':<20} {'8 node(s) x 8 GPUs':<20} {lo}-{hi} days ({PAPER_COST['gpus']} "
                 f"{PAPER_COST['hardware']})")
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
    tp = plan["throughputs"]
    ref = f"reference {tp['reference_params_b']} B" if tp.get("reference_params_b") else "per model"
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
    if any(tp[k] is None for k in THROUGHPUT_KEYS) and not tp["models"]:
        lines.append("n/a: give --throughputs FILE (benchmarks/gpu_check.py writes one) or --rollout-tps/"
                     "--train-tps/--eval-tps with --reference-params")
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
    parser.add_argument("--response-tokens", type=float, help="mean rollout tokens (default max_completion/3)")
    parser.add_argument("--eval-tokens", type=float, help="mean evaluation tokens per sample (default max_new/3)")
    parser.add_argument("--params", nargs="*", default=[], metavar="MODEL=B", help="parameters (billions) per model")
    parser.add_argument("--allow-cpu-throughputs", action="store_true",
                        help="accept throughputs measured on a CPU (gpu_check.py --cpu-smoke) for the estimate")
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
                        eval_tokens=args.eval_tokens, params=params)
    except ValueError as err:  # a model whose size is unknown (--params)
        raise UserError(str(err)) from None
    print(format_plan(plan))
    if args.json:
        atomic_write_json(args.json, plan)
    return 0
