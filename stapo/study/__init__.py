"""The study model: one YAML file (configs/paper.yaml, configs/tiny.yaml), read and validated here for every stage.

A study has six sections, each a dataclass whose fields are documented where they are defined:

    study     its name (results headings)
    models    key -> :class:`ModelEntry` (spec, GPUs, per-model ``train`` overrides, cluster resources)
    methods   key -> :class:`ObjectiveConfig` (stapo.objectives' hyper-parameters; ``objective`` names the method;
              stapo/study/objective.py), and the method's own ``train`` overrides (its recipe: the paper's baselines
              "follow the parameter settings reported in their original papers")
    train     :class:`TrainSettings`, the shared RL recipe (stapo/study/train.py)
    eval      :class:`EvalSection`, the evaluation protocol (stapo/study/evaluation.py)
    workflow  :class:`WorkflowSection`, what the Snakemake workflow runs and the resources it asks for

:func:`parse` is the one validation: YAML syntax (:func:`load`, file:line:column), then the structure against the
JSON schema ``workflow/schemas/config.schema.yaml`` (unknown keys at every level, types, the names of
the declared methods), then every section's values (the dataclasses' checks) and the cross-section rules (every
(model, method) plan and its TRL batch split, model specs; the checkpoints the workflow evaluates, named or
``eval_every``, are ones the run saves and keeps; a local ``eval.data_dir`` holds every evaluated benchmark).
No torch: ``stapo train``, ``stapo eval``, ``stapo plan`` and the Snakefile (so ``snakemake -n``) run it before
any model loads, and any error is a :class:`StudyError` whose one line names the file and the key.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from stapo import names
from stapo.errors import UserError
from stapo.limits import BOUNDS, MAX_CURVE_POINTS, MAX_SEEDS, MAX_YAML_BYTES, check_tree
from stapo.methods import METHODS
from stapo.models import check_spec
from stapo.schedule import optimizer_steps_per_rollout
from stapo.study.evaluation import EvalSection
from stapo.study.objective import OBJECTIVES, ObjectiveConfig, get_objective
from stapo.study.train import TrainSettings, accumulation, train_settings
from stapo.tasks.registry import BUNDLED, HUB, benchmark_file

__all__ = ["SCHEMA", "StudyError", "Study", "ModelEntry", "WorkflowSection", "Plan", "load", "parse", "read",
           "check_schema", "study_schema", "resolve_plan", "default", "curve_checkpoints", "kept_checkpoints",
           "TRAIN_SECTIONS", "split_run", "EvalSection", "ObjectiveConfig", "OBJECTIVES", "get_objective",
           "TrainSettings", "train_settings", "accumulation"]

SCHEMA = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"
SECTIONS = ("study", "models", "methods", "train", "eval", "workflow")  # the top-level keys, in order
TRAIN_SECTIONS = ("models", "methods", "train")  # what a `stapo train --recipe` file must hold
_MAX = 160  # characters of an offending value quoted in a message


class StudyError(UserError, ValueError):
    """A bad study file; the message is one line naming the file and the key (or line)."""


# ------------------------------------------------------------------------------------------------ sections


@dataclass(frozen=True)
class ModelEntry:
    """One entry of ``models``.

    Attributes:
        spec: hub id, local directory or ``bundled:<name>[?options]`` (stapo.models.resolve_model).
        gpus: GPUs (processes) per node of one training job; 0 = CPU; > 1 launches through ``accelerate``.
        nodes: nodes of one training job (the paper: 8 nodes of 8 GPUs). > 1 needs gpus >= 1 and the SLURM profile:
            one ``accelerate launch --num_machines nodes`` per node, started by ``srun`` (workflow/rules/common.smk);
            the local profile refuses it.
        accelerate_config: accelerate config file (FSDP2, configs/accelerate/fsdp*.yaml; or DeepSpeed), required when
            a job has more than one process.
        eval_gpus: GPUs of one evaluation job (None: 1 if gpus > 0 else 0).
        train_cpus, eval_cpus: CPUs of one training / evaluation job (None: ``workflow.threads`` per process,
            one process per GPU: threads × max(1, GPUs)).
        train_mem_mb, train_runtime, eval_mem_mb, eval_runtime: cluster resources of this model's jobs (MB,
            minutes); None = the workflow section's.
        train: overrides of the ``train`` section for this model (e.g. the 14B's vLLM memory fraction).
    """

    spec: str
    gpus: int = 0
    nodes: int = 1
    accelerate_config: str | None = None
    eval_gpus: int | None = None
    train_cpus: int | None = None
    eval_cpus: int | None = None
    train_mem_mb: int | None = None
    train_runtime: int | None = None
    eval_mem_mb: int | None = None
    eval_runtime: int | None = None
    train: dict = field(default_factory=dict)

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


@dataclass(frozen=True)
class WorkflowSection:
    """The ``workflow`` section: which jobs the Snakemake workflow plans, and their resources.

    Attributes:
        models: model keys to run (a subset of ``models``; None = all).
        checkpoints: checkpoints that get the full evaluation (every benchmark × setting): ``final`` or
            ``checkpoint-N``.
        eval_every: evaluate a checkpoint every N training (rollout) steps below ``train.max_steps`` on
            ``curve_benchmark`` (paper Figure 1: 20); must be a multiple of ``train.save_steps``. None = no curve.
        curve_benchmark: the benchmark of the accuracy-vs-step curve (skipped when the study does not evaluate it).
        curve_settings: sampling settings of the curve evaluations (None = all of ``eval.settings``).
        eval_base: also evaluate the untrained model (method and checkpoint ``base``).
        real_benchmarks_need_data_dir: only ``arith`` runs unless ``eval.data_dir`` is set (offline miniature).
        threads: CPU threads per process of a training or evaluation job: a job of N GPUs gets N × threads CPUs
            (a CPU job: threads), unless its model sets ``train_cpus`` / ``eval_cpus``.
        train_mem_mb, train_runtime, eval_mem_mb, eval_runtime: default job resources (MB of node memory,
            minutes per attempt; a retried training job resumes from its last checkpoint).
        seeds: training seeds: every (model, method) is trained once per seed (``stapo train --seed``: data order,
            rollout sampling, anything random) and each seed's checkpoints are evaluated; the report shows the
            across-seed mean with a CI over seeds and problems (stapo.seed_statistics). None = ``[train.seed]``.
            One seed keeps the one-run layout (``runs/<model>/<method>/``); several give
            ``runs/<model>/<method>/seed<k>/`` and ``scores/<model>/<method>/seed<k>/...``.
        keep_checkpoints: false: once a run's final/ is written, its training job deletes the run's
            ``checkpoint-N/`` directories that no evaluation of the workflow reads (``checkpoints``, the
            ``eval_every`` curve): each holds the optimizer state (the CPU miniature: 1.6 GB, 15 GB a demo). A
            finished run needs none to resume; the report reads metrics.jsonl and the diagnostics, not checkpoints.
    """

    models: list | None = None
    checkpoints: list = field(default_factory=lambda: ["final"])
    eval_every: int | None = None
    curve_benchmark: str = "aime24"
    curve_settings: list | None = field(default_factory=lambda: ["t1.0_p1.0"])
    eval_base: bool = True
    real_benchmarks_need_data_dir: bool = False
    threads: int = 1
    train_mem_mb: int = 256000
    train_runtime: int = 2880
    eval_mem_mb: int = 64000
    eval_runtime: int = 720
    seeds: list | None = None
    keep_checkpoints: bool = True


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

    def label(self, kind: str, key: str) -> str:
        """What tables and figures call ``key`` of ``kind`` ("models", "methods", "benchmarks", "settings"): the
        study's ``label``, else the registry's (stapo.names), else ``T<temperature>/p<top_p>`` for a setting the
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
        _checked(self.source, lambda: _check_spec(model, self.models[model].spec))
        return Plan(model, self.models[model].spec, method, self.methods[method], settings)

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


def _checked(source: str, build):
    """``build()``, its ValueError/TypeError as a one-line StudyError naming ``source``."""
    try:
        return build()
    except (ValueError, TypeError) as err:
        raise StudyError(f"{source}: {err}") from None


# ---------------------------------------------------------------------------------------------- reading


def load(path: str | os.PathLike) -> dict:
    """The mapping in a YAML file; StudyError for a missing file, a syntax error (file:line:col) or a non-mapping."""
    path = Path(path)
    if not path.is_file():
        raise StudyError(f"{path}: file not found")
    size = path.stat().st_size
    if size > MAX_YAML_BYTES:
        raise StudyError(f"{path}: {size:,} bytes; a study file is at most {MAX_YAML_BYTES:,} (configs/paper.yaml: "
                         "9 KB)")
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise StudyError(f"{path}: not UTF-8 text (byte {err.start}: {err.reason})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise StudyError(f"{where}: YAML syntax error: {problem}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise StudyError(f"{path}: expected a mapping of sections ({', '.join(SECTIONS)}), got {type(doc).__name__}")
    return doc


def _message(err) -> str:
    """One line for a jsonschema error: the dotted key, then what is wrong with it."""
    path = ".".join(str(p) for p in err.absolute_path)
    if err.validator == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        unknown = sorted(set(err.instance) - set(allowed))
        key = f"{path}.{unknown[0]}" if path and unknown else (unknown[0] if unknown else path)
        return f"{key}: unknown key" + (f"; expected one of {allowed}" if allowed else "")
    if "propertyNames" in err.schema_path:  # a key, not a value
        why = err.schema.get("$comment") if err.validator == "pattern" else None
        message = err.message[:_MAX] + (f" ({why})" if why else "")
        return f"{path}: {message}" if path else message
    if err.validator == "required":
        return f"{path or 'top level'}: {err.message}"
    if err.validator in ("maximum", "minimum", "maxItems") and "$comment" in err.schema:
        return f"{path or 'top level'}: {err.message[:_MAX]} ({err.schema['$comment']})"
    hint = ""
    if err.validator == "type" and isinstance(err.instance, str) and _is_yaml_scalar(err.instance):
        hint = ("; snakemake --config reads values nested in {...} as strings: put the override in a file and "
                "add it with a second --configfile")
    return f"{path or 'top level'}: {err.message[:_MAX]}{hint}"


def _is_yaml_scalar(text: str) -> bool:
    """Whether ``text`` reads as a YAML number or boolean (a value snakemake's --config left a string)."""
    try:
        return isinstance(yaml.safe_load(text), (int, float, bool))
    except yaml.YAMLError:
        return False


def study_schema() -> dict:
    """The study schema (``SCHEMA``) with its name enums filled from the declarations (stapo/methods.py)."""
    schema = yaml.safe_load(SCHEMA.read_text(encoding="utf-8"))
    methods = schema["properties"]["methods"]["additionalProperties"]["properties"]
    methods["objective"]["enum"] = list(METHODS)
    _bound_numbers(schema)
    seeds = schema["properties"]["workflow"]["properties"]["seeds"]
    seeds["items"].update(maximum=BOUNDS["seed"].maximum, **{"$comment": BOUNDS["seed"].why})
    seeds["maxItems"] = MAX_SEEDS
    return schema


def _bound_numbers(node) -> None:
    """Every integer / number property of the schema named in stapo.limits.BOUNDS gets that bound (the reason as
    its ``$comment``, which :func:`_message` quotes)."""
    if not isinstance(node, dict):
        return
    for name, sub in (node.get("properties") or {}).items():
        types = sub.get("type") if isinstance(sub, dict) else None
        types = types if isinstance(types, list) else [types]
        if name in BOUNDS and {"integer", "number"} & set(types):
            bound = BOUNDS[name]
            sub.update(minimum=bound.minimum, maximum=bound.maximum, **{"$comment": bound.why})
        _bound_numbers(sub)
    for key in ("additionalProperties", "items"):
        _bound_numbers(node.get(key))


def check_schema(config: dict, *, source: str = "config", required: tuple[str, ...] | None = None) -> None:
    """The structure of ``config`` against the study schema; StudyError names the first bad key (and how many more).

    ``required`` replaces the schema's top-level required sections (``stapo train`` needs only TRAIN_SECTIONS;
    ``stapo eval`` only ``eval``, and then not its benchmarks and settings: the paper's fill them).
    """
    import jsonschema

    schema = study_schema()
    if required is not None:  # a command's recipe: only what that command reads (eval defaults fill the rest)
        schema["required"] = list(required)
        schema["properties"]["eval"].pop("required")
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(config),
                    key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        first = jsonschema.exceptions.best_match(errors)
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        raise StudyError(f"{source}: {_message(first)}{more}")


# ---------------------------------------------------------------------------------------------- parsing


def _objective(key: str, entry: dict) -> ObjectiveConfig:
    entry = dict(entry or {})
    entry.pop("train", None)  # the method's recipe overrides (Study.method_train), not an objective parameter
    name = entry.pop("objective", key)
    entry.pop("label", None)  # the study's display label (Study.label), not a hyper-parameter
    known = {f.name for f in dataclasses.fields(ObjectiveConfig)} - {"method"}
    unknown = sorted(set(entry) - known)
    if unknown:
        raise ValueError(f"methods.{key}: unknown key(s) {unknown}; expected some of {sorted(known)}")
    try:
        return get_objective(name, **entry)
    except (ValueError, TypeError) as err:
        raise ValueError(f"methods.{key}.{err}") from None


def _check_spec(key: str, spec: str) -> None:
    """The model spec names a model (bundled name, local HF directory or hub id); builds and loads nothing."""
    try:
        check_spec(str(spec))
    except (ValueError, OSError) as err:
        raise ValueError(f"models.{key}.spec: {err}") from None


def _model(key: str, entry: dict) -> ModelEntry:
    model = ModelEntry(**{k: v for k, v in entry.items() if v is not None or k == "accelerate_config"})
    if model.nodes > 1 and model.gpus < 1:
        raise ValueError(f"models.{key}.nodes: {model.nodes} nodes need gpus >= 1 per node (gpus = {model.gpus})")
    if model.processes > 1 and not model.accelerate_config:
        raise ValueError(f"models.{key}.accelerate_config: required when gpus = {model.gpus} > 1"
                         + (f" or nodes = {model.nodes} > 1" if model.nodes > 1 else ""))
    return model


def parse(config: dict, *, source: str = "config", required: tuple[str, ...] | None = None,
          check_runs: bool = True) -> Study:
    """Validate a study mapping (module docstring) and return it as a :class:`Study`; StudyError otherwise.

    ``required``: the top-level sections the caller needs (default: the schema's, i.e. a whole study).
    ``check_runs``: also resolve every (model, method) run the workflow would plan (the model spec, its train
    section with the model's overrides, and the TRL batch split for the model's GPUs) and the workflow's curve
    checkpoints. Without it, :meth:`Study.plan` still checks the run it resolves.
    """
    _checked(source, lambda: check_tree(config))  # before anything walks it: aliases expanded, NaN
    check_schema(config, source=source, required=required)
    study = Study(
        name=str(config.get("study", "study")),
        models=_checked(source, lambda: {k: _model(k, v) for k, v in (config.get("models") or {}).items()}),
        methods=_checked(source, lambda: {k: _objective(k, v) for k, v in (config.get("methods") or {}).items()}),
        train=_checked(source, lambda: train_settings(config.get("train") or {})),
        eval=_checked(source, lambda: EvalSection.from_dict(config.get("eval"))),
        workflow=WorkflowSection(**{k: v for k, v in (config.get("workflow") or {}).items()}),
        source=source,
        labels={"methods": {k: v["label"] for k, v in (config.get("methods") or {}).items()
                            if isinstance(v, dict) and v.get("label")}},
        method_train={k: dict(v["train"]) for k, v in (config.get("methods") or {}).items()
                      if isinstance(v, dict) and v.get("train")},
    )
    for method, own in study.method_train.items():  # validated like train, over it
        _checked(source, lambda: train_settings({**dataclasses.asdict(study.train), **own}, f"methods.{method}.train"))
    if "eval" in config and "curve_settings" in (config.get("workflow") or {}):
        missing = [s for s in study.workflow.curve_settings or () if s not in study.eval.settings]
        if missing:
            raise StudyError(f"{source}: workflow.curve_settings: {missing[0]!r} is not a key of eval.settings "
                             f"({', '.join(study.eval.settings)})")
    seeds = study.workflow.seeds
    if seeds is not None and len(set(seeds)) != len(seeds):
        raise StudyError(f"{source}: workflow.seeds: {seeds} repeats a seed")
    unknown = [m for m in study.workflow.models or () if m not in study.models]
    if unknown:
        raise StudyError(f"{source}: workflow.models: {unknown[0]!r} is not a key of models "
                         f"({', '.join(study.models)})")
    if check_runs and "train" in config:
        for model in study.run_models:  # a run's settings: its model's and its method's overrides
            _checked(source, lambda: _check_spec(model, study.models[model].spec))
            for method in [None, *study.method_train]:
                settings = study.train_settings(model, method)
                _checked(source, lambda: accumulation(settings, study.models[model].processes))
                _checked(source, lambda: _check_evaluated_checkpoints(study, model, method))
    if "eval" in config:
        _checked(source, lambda: _check_data_dir(study))
    return study


def default() -> Study:
    """The empty study: no models or methods, the paper's train, eval and workflow defaults."""
    return parse({}, source="defaults", required=())


def kept_checkpoints(settings: TrainSettings) -> list[int]:
    """TRL optimiser steps of the ``checkpoint-<N>`` a finished run still holds: one every ``save_steps`` rollout
    steps and one at ``max_steps`` (HF's Trainer saves at the end too), the newest ``save_total_limit`` of them."""
    k = optimizer_steps_per_rollout(settings)
    every, last = settings.save_steps, settings.max_steps
    saves = last // every + (last % every != 0)  # the periodic saves, and one at max_steps unless it is one
    newest = min(saves, settings.save_total_limit or saves)  # the tail only: never one entry per save of the run
    steps = [last] if last % every else []
    steps = [every * i for i in range(last // every - newest + len(steps) + 1, last // every + 1)] + steps
    return [n * k for n in steps]


def _check_evaluated_checkpoints(study: Study, model: str, method: str | None = None) -> None:
    """Every checkpoint the workflow evaluates (``workflow.checkpoints``, the ``eval_every`` curve) is one the run
    saves and still holds when its evaluations start (after final/)."""
    settings = study.train_settings(model, method)
    kept = kept_checkpoints(settings)
    kept_set = set(kept)
    named = [("workflow.checkpoints", c) for c in study.workflow.checkpoints if c != "final"]
    named += [("workflow.eval_every", c) for c in curve_checkpoints(study, model, method)]
    for key, ckpt in named:
        n = int(ckpt.removeprefix("checkpoint-"))
        if n in kept_set:
            continue
        k = optimizer_steps_per_rollout(settings)
        saved = n % (settings.save_steps * k) == 0 and 0 < n <= settings.max_steps * k
        why = (f"train.save_total_limit ({settings.save_total_limit}) deletes it before the evaluations run"
               if saved else f"train.save_steps {settings.save_steps} × {k} optimiser steps per rollout step up "
               f"to train.max_steps {settings.max_steps} never saves it")
        shown = ", ".join(f"checkpoint-{m}" for m in kept[-6:])
        run = f"models.{model}" + (f" (methods.{method})" if method else "")
        raise ValueError(f"{key}: {ckpt} of {run} will not exist: {why}; the run keeps "
                         + (shown if len(kept) <= 6 else f"{len(kept):,} checkpoints, the newest {shown}"))


def _check_data_dir(study: Study) -> None:
    """A local ``eval.data_dir`` holds the file of every shipped benchmark the study evaluates from it (arith is
    generated; a benchmark with its own ``file`` does not read it)."""
    data_dir = study.eval.data_dir
    if data_dir in (None, "", BUNDLED, HUB):
        return
    if not Path(data_dir).is_dir():
        raise ValueError(f"eval.data_dir: directory {data_dir} not found (or use 'bundled', the files shipped in "
                         "stapo/tasks/data, or 'hub')")
    for bench in study.eval.benchmarks:
        path = benchmark_file(bench, data_dir) if study.eval.uses_data_dir(bench) else None
        if path is not None and not path.is_file():
            raise ValueError(f"eval.data_dir: {path} not found (benchmark {bench}; fields id, problem, answer)")


def read(path: str | os.PathLike, *, required: tuple[str, ...] | None = None, check_runs: bool = True) -> Study:
    """:func:`load` then :func:`parse`, errors naming ``path``."""
    return parse(load(path), source=str(path), required=required, check_runs=check_runs)


def resolve_plan(config: dict, model: str, method: str, *, max_steps: int | None = None,
                 seed: int | None = None) -> Plan:
    """The validated plan of one (model, method) run of a study mapping (errors as StudyError)."""
    return parse(config, required=TRAIN_SECTIONS, check_runs=False).plan(model, method, max_steps=max_steps,
                                                                         seed=seed)


def curve_checkpoints(study: Study, model: str, method: str | None = None) -> list[str]:
    """The accuracy-curve checkpoints of ``model``: rollout steps eval_every, 2 eval_every, ... < train.max_steps
    (final is the curve's last point), named by TRL's optimiser step (``checkpoint-<k × step>``, stapo.schedule)."""
    every = study.workflow.eval_every
    if not every:
        return []
    train = study.train_settings(model, method)
    if every % train.save_steps:
        raise ValueError(f"workflow.eval_every ({every}) must be a multiple of train.save_steps "
                         f"({train.save_steps}): only saved checkpoints can be evaluated")
    points = (train.max_steps - 1) // every
    if points > MAX_CURVE_POINTS:
        raise ValueError(f"workflow.eval_every ({every}) puts {points:,} checkpoints of train.max_steps "
                         f"{train.max_steps:,} on the accuracy curve; at most {MAX_CURVE_POINTS:,} (the paper's "
                         "has 150): raise eval_every")
    k = optimizer_steps_per_rollout(train)
    return [f"checkpoint-{n * k}" for n in range(every, train.max_steps, every)]
