"""The sections of a study that are not a recipe of their own: ``models`` entries, ``workflow``, and the parsed
:class:`Study` with the (model, method) :class:`Plan` it resolves. Each field documents itself (stapo.core.fields); the
``train``, ``methods`` and ``eval`` sections are stapo/study/train.py, objective.py and evaluation.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from stapo.study import names
from stapo.core.errors import UserError
from stapo.core.fields import option
from stapo.core.limits import MAX_KEY_CHARS
from stapo.models import check_spec
from stapo.study.evaluation import EvalSection
from stapo.study.methods import METHODS as DECLARED_METHODS, Family
from stapo.study.objective import ObjectiveConfig
from stapo.study.train import TrainSettings, train_settings

__all__ = ["StudyError", "ModelEntry", "WorkflowSection", "Plan", "Study", "split_run", "KEY_PATTERN", "KEY_RULE"]

# a key that names a directory (runs/<model>/<method>/, scores/...). The whole key must match: Python's `$` also
# matches before a trailing newline ("grpo\n" passed), so the pattern ends at `$(?!\n)`, the end of the text for
# both Python's re (the study check, snakemake's validate) and ECMA-262 (other readers of the JSON schema).
KEY_PATTERN = f"^[A-Za-z0-9_][A-Za-z0-9_.-]{{0,{MAX_KEY_CHARS - 1}}}$(?!\n)"
KEY_RULE = (f"a key names a directory (runs/<model>/<method>/, scores/...): 1 to {MAX_KEY_CHARS} letters, digits, "
            "_ . -, not starting with a dot, so never . or ..")


class StudyError(UserError, ValueError):
    """A bad study file; the message is one line naming the file and the key (or line)."""


def _checked(source: str, build):
    """``build()``, its ValueError/TypeError as a one-line StudyError naming ``source``."""
    try:
        return build()
    except (ValueError, TypeError) as err:
        raise StudyError(f"{source}: {err}") from None


def check_model_spec(key: str, spec: str) -> None:
    """The model spec names a model (bundled name, local HF directory or hub id); builds and loads nothing."""
    try:
        check_spec(str(spec))
    except (ValueError, OSError) as err:
        raise ValueError(f"models.{key}.spec: {err}") from None


@dataclass(frozen=True)
class ModelEntry:
    """One entry of ``models``: the model and what one of its jobs gets."""

    spec: str = option(help="hub id, local directory or ``bundled:<name>[?options]`` (stapo.models.resolve_model)")
    gpus: int = option(0, "GPUs (processes) per node of one training job; 0 = CPU; > 1 launches through accelerate",
                       minimum=0)
    nodes: int = option(1, "nodes of one training job (the paper: 8 nodes of 8 GPUs). > 1 needs gpus >= 1 and the "
                        "SLURM profile: one ``accelerate launch --num_machines nodes`` per node, started by srun "
                        "(workflow/rules/common.smk); the local profile refuses it", minimum=1)
    accelerate_config: str | None = option(None, "accelerate config (FSDP2: configs/accelerate/fsdp*.yaml; or "
                                           "DeepSpeed), required when a job has more than one process")
    eval_gpus: int | None = option(None, "GPUs of one evaluation job (default: 1 if gpus > 0 else 0)", minimum=0)
    train_cpus: int | None = option(None, "CPUs of one training job (default workflow.threads x max(1, gpus))",
                                    minimum=1)
    eval_cpus: int | None = option(None, "CPUs of one evaluation job (default workflow.threads x max(1, eval GPUs))",
                                   minimum=1)
    train_mem_mb: int | None = option(None, "MB of memory of this model's training jobs (default: the workflow "
                                      "section's)", minimum=1)
    train_runtime: int | None = option(None, "minutes per attempt of a training job (default: the workflow "
                                       "section's)", minimum=1)
    eval_mem_mb: int | None = option(None, "MB of memory of this model's evaluation jobs (default: the workflow "
                                     "section's)", minimum=1)
    eval_runtime: int | None = option(None, "minutes of an evaluation job (default: the workflow section's)",
                                      minimum=1)
    train: dict = option(help="per-model overrides of the train section (e.g. the 14B's vLLM memory fraction; "
                         "checked as train is)", default_factory=dict)

    @property
    def processes(self) -> int:
        """Processes of one training job, all nodes: its data-parallel world size."""
        return max(1, self.gpus) * self.nodes

    @property
    def eval_devices(self) -> int:
        return self.eval_gpus if self.eval_gpus is not None else (1 if self.gpus > 0 else 0)

    def cpus(self, job: str, threads: int) -> int:
        """CPUs of one ``job`` ("train" / "eval"): the explicit entry, else ``threads`` per process (per GPU)."""
        explicit = self.train_cpus if job == "train" else self.eval_cpus
        devices = self.gpus if job == "train" else self.eval_devices
        return explicit if explicit is not None else threads * max(1, devices)

    def check(self, key: str) -> "ModelEntry":
        if self.nodes > 1 and self.gpus < 1:
            raise ValueError(f"models.{key}.nodes: {self.nodes} nodes need gpus >= 1 per node (gpus = {self.gpus})")
        if self.processes > 1 and not self.accelerate_config:
            raise ValueError(f"models.{key}.accelerate_config: required when gpus = {self.gpus} > 1"
                             + (f" or nodes = {self.nodes} > 1" if self.nodes > 1 else ""))
        return self


@dataclass(frozen=True)
class WorkflowSection:
    """The ``workflow`` section: which jobs the Snakemake workflow plans, and their resources."""

    models: list[str] | None = option(None, "model keys to run (a subset of models; null = all)")
    checkpoints: list[str] = option(
        help="checkpoints that get the full evaluation (every benchmark x setting): final or checkpoint-N",
        default_factory=lambda: ["final"], minItems=1,
        items={"type": "string", "pattern": "^(final|checkpoint-[0-9]{1,18})$(?!\\n)"})
    eval_every: int | None = option(
        None, "evaluate a checkpoint every N training (rollout) steps below train.max_steps on curve_benchmark "
        "(paper Figure 1: 20), from the run's evaluation snapshots (train.snapshot_steps); final is the curve's last "
        "point. null = no curve",
        minimum=1)
    curve_benchmark: str = option("aime24", "the benchmark of the accuracy-vs-step curve (skipped when the study "
                                  "does not evaluate it)")
    curve_settings: list[str] | None = option(
        help="sampling settings of the curve evaluations (default the training-aligned one; null = all eval.settings)",
        default_factory=lambda: ["t1.0_p1.0"])
    eval_base: bool = option(True, "also evaluate the untrained model (method and checkpoint 'base')")
    real_benchmarks_need_data_dir: bool = option(
        False, "true: benchmarks other than arith run only when eval.data_dir is set (offline miniature)")
    threads: int = option(1, "CPU threads per process of a training or evaluation job: a job of N GPUs gets N x "
                          "threads CPUs (a CPU job: threads), unless its model sets train_cpus / eval_cpus", minimum=1)
    train_mem_mb: int = option(256000, "MB of node memory of a training job", minimum=1)
    train_runtime: int = option(2880, "minutes per attempt of a training job; a retry resumes from its last "
                                "checkpoint", minimum=1)
    eval_mem_mb: int = option(64000, "MB of node memory of an evaluation job", minimum=1)
    eval_runtime: int = option(720, "minutes of an evaluation job", minimum=1)
    seeds: list[int] | None = option(
        None, "training seeds, one run per (model, method, seed) (stapo train --seed: data order, rollout sampling); "
        "each seed's checkpoints are evaluated and the report shows the across-seed mean with a CI over seeds and "
        "problems (stapo.report.seed_statistics). null = [train.seed], the one-run layout runs/<model>/<method>/; "
        "several "
        "give runs/<model>/<method>/seed<k>/ and scores/<model>/<method>/seed<k>/...", minItems=1,
        items={"type": "integer", "minimum": 0})
    keep_checkpoints: bool = option(
        True, "false: once a run's final/ is written, its training job deletes the run's resume checkpoints "
        "(checkpoint-N/: weights, optimiser and RNG state, the newest train.save_total_limit of them); a finished run "
        "needs none to resume, only to train further")
    keep_snapshots: bool = option(
        False, "true: keep every evaluation snapshot (snapshot-N/: weights only) after its evaluations; false: "
        "Snakemake deletes each once every evaluation that reads it is scored (a temp() output)")
    train_leave_before: int = option(
        3600, "seconds before a SLURM training job's wall-time limit at which it is asked to leave (sbatch "
        "--signal=USR1@<seconds>, at most half the job's train_runtime; SLURM may send it up to a minute early): it "
        "trains to the end of its rollout step, saves a resume checkpoint and requeues itself "
        "(stapo.train.continuation). Must cover one rollout step and a checkpoint save, and come after the job's "
        "start-up", minimum=10, maximum=65535)


@dataclass
class Plan:
    """Everything one ``stapo train`` run needs, resolved and validated (written to DIR/config.yaml)."""

    model_key: str
    model_spec: str
    method_key: str
    objective: ObjectiveConfig
    settings: TrainSettings


@dataclass(frozen=True)
class Study:
    """A parsed, validated study (:func:`parse`). Sections absent from the file hold the paper's defaults
    (``train``, ``eval``, ``workflow``) or are empty (``models``, ``methods``)."""

    name: str
    models: dict[str, ModelEntry]
    methods: dict[str, ObjectiveConfig]
    train: TrainSettings
    eval: EvalSection
    workflow: WorkflowSection
    source: str = "config"
    labels: dict = field(default_factory=dict)  # {"methods": {key: label}}: the study's own labels (``label``)
    method_train: dict = field(default_factory=dict)  # {method: its ``train`` overrides} (methods.<key>.train)

    def family(self, method: str) -> Family | None:
        """The report's group of ``method`` (stapo.study.methods.Family: the paper's four, ablations, verl's,
        TRL's): its objective's declaration; None for the base model and keys no declaration knows."""
        objective = self.methods[method].method if method in self.methods else method
        return DECLARED_METHODS[objective].family if objective in DECLARED_METHODS else None

    def grouped(self, methods) -> list[str]:
        """``methods`` in their order, stably grouped by :meth:`family` (the base model first)."""
        order = list(Family)
        return sorted(methods, key=lambda m: -1 if self.family(m) is None else order.index(self.family(m)))

    def label(self, kind: str, key: str) -> str:
        """What tables and figures call ``key`` of ``kind`` ("models", "methods", "benchmarks", "settings"): the
        study's ``label``, else the registry's (stapo.study.names), else ``T<temperature>/p<top_p>`` for a setting the
        study declares, else the key itself."""
        own = {"methods": self.labels.get("methods", {}),
               "benchmarks": {k: b.label for k, b in self.eval.benchmarks.items() if b.label},
               "settings": {k: s["label"] for k, s in self.eval.settings.items() if s.get("label")}}.get(kind, {})
        if key in own:
            return own[key]
        registry = {"models": names.MODELS, "methods": names.METHODS, "benchmarks": names.BENCHMARKS,
                    "settings": names.SETTINGS}[kind]
        if key in registry:
            return registry[key].label
        if kind == "settings" and key in self.eval.settings:
            setting = self.eval.settings[key]
            return f"T{setting['temperature']:g}/p{setting['top_p']:g}"
        return key

    def plan(self, model: str, method: str, *, max_steps: int | None = None, seed: int | None = None) -> Plan:
        """The resolved (model, method) run: the method's objective and the train section with the model's
        overrides (and the CLI's ``max_steps`` / ``seed``)."""
        for section, key in (("models", model), ("methods", method)):
            if key not in getattr(self, section):
                raise StudyError(f"{self.source}: {section}: no {key!r}; the study defines "
                                 f"{sorted(getattr(self, section))}")
        cli = {k: v for k, v in (("max_steps", max_steps), ("seed", seed)) if v is not None}
        if cli:
            _checked(self.source, lambda: train_settings({**dataclasses.asdict(self.train), **cli}, "train"))
        settings = self.train_settings(model, method, **cli)
        _checked(self.source, lambda: check_model_spec(model, self.models[model].spec))
        objective = self.methods[method].with_horizon(settings.max_completion_length)  # dr_grpo's L: TRL's
        return Plan(model, self.models[model].spec, method, objective, settings)

    def train_settings(self, model: str, method: str | None = None, **overrides) -> TrainSettings:
        """The ``train`` section with ``methods.<method>.train`` (the method's recipe), then ``models.<model>.train``
        (the model's hardware settings), then ``overrides`` over it, validated."""
        own = self.method_train.get(method, {}) if method is not None else {}
        section = {**dataclasses.asdict(self.train), **own, **self.models[model].train, **overrides}
        where = f"models.{model}.train" + (f" with methods.{method}.train" if own else "")
        return _checked(self.source, lambda: train_settings(section, where))

    def train_overrides(self) -> dict[str, dict]:
        """{method: its train overrides} of the methods that have any (the report's protocol footnote)."""
        return {m: dict(t) for m, t in self.method_train.items() if t}

    @property
    def curve_settings(self) -> list[str]:
        """The settings of the accuracy-curve evaluations: ``workflow.curve_settings`` (default the training-aligned
        t1.0_p1.0) among the study's settings, else its first setting."""
        chosen = [s for s in self.workflow.curve_settings or self.eval.settings if s in self.eval.settings]
        return chosen or list(self.eval.settings)[:1]

    @property
    def run_models(self) -> list[str]:
        """The model keys the workflow runs."""
        return list(self.workflow.models or self.models)

    @property
    def seeds(self) -> list[int]:
        """The training seeds of the study (``workflow.seeds``, default ``[train.seed]``)."""
        return list(self.workflow.seeds or [self.train.seed])

    def runs(self, method: str) -> dict[str, int]:
        """{run name: seed} of one method: the run name is the method key with one seed (the one-run layout),
        ``<method>/seed<k>`` with several (the path below ``runs/<model>/`` and ``scores/<model>/``)."""
        if len(self.seeds) == 1:
            return {method: self.seeds[0]}
        return {f"{method}/seed{k}": k for k in self.seeds}


def split_run(run: str) -> tuple[str, int | None]:
    """(method, seed) of a run name (:meth:`Study.runs`): ``stapo`` -> (stapo, None), ``stapo/seed2`` -> (stapo, 2)."""
    method, _, seed = run.partition("/seed")
    return method, (int(seed) if seed else None)
