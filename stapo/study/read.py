"""Reading a study: YAML (:func:`load`), its structure against the generated schema (:func:`check_schema`), then
every section's values and the cross-section rules (:func:`parse`); see stapo.study."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import yaml

from stapo.core.fields import check_keys, from_mapping
from stapo.core import bounded, limits
from stapo.core.limits import MAX_CURVE_POINTS, check_tree
from stapo.core.schedule import optimizer_steps_per_rollout
from stapo.study.evaluation import EvalSection
from stapo.study.objective import ObjectiveConfig, get_objective
from stapo.study.schema import SECTIONS, study_schema
from stapo.study.sections import ModelEntry, Plan, Study, StudyError, WorkflowSection, _checked, check_model_spec
from stapo.study.train import accumulation, train_settings
from stapo.tasks.registry import BUNDLED, HUB, benchmark_file

__all__ = ["load", "load_files", "overlay", "check_schema", "parse", "read", "resolve_plan", "default",
           "curve_checkpoints", "snapshot_steps", "TRAIN_SECTIONS"]

TRAIN_SECTIONS = ("models", "methods", "train")  # what a `stapo train --recipe` file must hold
_MAX = 160  # characters of an offending value quoted in a message


# ---------------------------------------------------------------------------------------------- reading


def load(path: str | os.PathLike) -> dict:
    """The mapping in a YAML file; StudyError for a missing file, one that is not a regular file or is over
    MAX_YAML_BYTES, a syntax error (file:line:col), nesting over MAX_DEPTH, a duplicate key or a non-mapping
    (stapo.core.bounded reads it)."""
    path = Path(path)
    if not path.exists():
        raise StudyError(f"{path}: file not found")
    try:
        doc = bounded.parse_yaml(bounded.read_text(path, limits.MAX_YAML_BYTES, "a study file (configs/paper.yaml: "
                                                   "9 KB)"), str(path))
    except bounded.BadFile as err:
        raise StudyError(str(err)) from None
    except OSError as err:
        raise StudyError(f"{path}: cannot read it ({err.strerror})") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise StudyError(f"{path}: expected a mapping of sections ({', '.join(SECTIONS)}), got {type(doc).__name__}")
    return doc


def overlay(base: dict, extra: dict) -> dict:
    """``extra`` deep-merged into ``base`` (in place, returned), as Snakemake merges a second ``--configfile``:
    mappings merge key by key, any other value replaces."""
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            overlay(base[key], value)
        else:
            base[key] = value
    return base


def load_files(files) -> dict:
    """The study of ``files``: the first, each later one an overlay (:func:`overlay`), every file read by
    :func:`load` (bounded: size, nesting, duplicate keys, UTF-8), before anything else sees it. What the workflow's
    ``--config study_file=FILE`` and ``stapo plan --configfile`` read."""
    files = [files] if isinstance(files, (str, os.PathLike)) else list(files)
    if not files or not all(isinstance(f, (str, os.PathLike)) and str(f) for f in files):
        raise StudyError(f"study_file: expected a file or a list of files, got {files!r:.100}")
    config = load(files[0])
    for extra in files[1:]:
        overlay(config, load(extra))
    return config


def _message(err) -> str:
    """One line for a jsonschema error: the dotted key, then what is wrong with it."""
    path = ".".join(str(p) for p in err.absolute_path)
    if err.validator == "additionalProperties":  # worded as the dataclass reader's (stapo.core.fields.check_keys)
        try:
            check_keys(err.instance, err.schema.get("properties", {}), path)
        except ValueError as unknown:
            return str(unknown)
    if "propertyNames" in err.schema_path:  # a key, not a value
        why = err.schema.get("$comment") if err.validator == "pattern" else None
        key = str(err.instance)
        message = err.message[:_MAX] if len(key) <= 40 else (f"{key[:40]!r}… ({len(key):,} characters) is not a "
                                                               "valid key")
        message += f" ({why})" if why else ""
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
    name = entry.get("objective", key)
    # ``train`` (the method's recipe, Study.method_train) and ``label`` (Study.label) are read by parse
    params = {k: v for k, v in entry.items() if k not in ("objective", "train", "label")}
    check_keys(params, {f.name for f in dataclasses.fields(ObjectiveConfig)} - {"method"}, f"methods.{key}")
    try:
        return get_objective(name, **params)
    except (ValueError, TypeError) as err:
        raise ValueError(f"methods.{key}.{err}") from None



def _model(key: str, entry: dict) -> ModelEntry:
    given = {k: v for k, v in entry.items() if v is not None or k == "accelerate_config"}
    return from_mapping(ModelEntry, given, f"models.{key}").check(key)


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
        workflow=_checked(source, lambda: from_mapping(WorkflowSection, config.get("workflow"), "workflow")),
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
    for key, entry in study.models.items():  # a bundled model's options, run or not: they are bounded
        if str(entry.spec).startswith("bundled:"):
            _checked(source, lambda: check_model_spec(key, entry.spec))
    if check_runs and "train" in config:
        for model in study.run_models:  # a run's settings: its model's and its method's overrides
            _checked(source, lambda: check_model_spec(model, study.models[model].spec))
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


def snapshot_steps(study: Study, model: str, method: str | None = None) -> list[int]:
    """The rollout steps after which the run of (model, method) writes an evaluation snapshot (``snapshot-<N>``,
    stapo.train.rundir): those of the ``checkpoint-<N>`` the workflow evaluates (``workflow.checkpoints``, the
    ``eval_every`` curve), N = k × the rollout step."""
    k = optimizer_steps_per_rollout(study.train_settings(model, method))
    named = [c for c in study.workflow.checkpoints if c != "final"] + curve_checkpoints(study, model, method)
    return sorted({int(c.removeprefix("checkpoint-")) // k for c in named})


def _check_evaluated_checkpoints(study: Study, model: str, method: str | None = None) -> None:
    """Every checkpoint the workflow evaluates (``workflow.checkpoints``, the ``eval_every`` curve) is one the run
    writes a snapshot of: a rollout boundary (a multiple of k optimiser steps) below train.max_steps; the curve has
    at most MAX_CURVE_POINTS points."""
    curve_checkpoints(study, model, method)
    settings = study.train_settings(model, method)
    k = optimizer_steps_per_rollout(settings)
    for ckpt in (c for c in study.workflow.checkpoints if c != "final"):
        n = int(ckpt.removeprefix("checkpoint-"))
        if n % k or not 0 < n < settings.max_steps * k:
            run = f"models.{model}" + (f" (methods.{method})" if method else "")
            raise ValueError(f"workflow.checkpoints: {ckpt} of {run} will not exist: evaluation snapshots are taken "
                             f"at rollout boundaries, checkpoint-<k x step> with k = {k} optimiser steps per rollout "
                             f"step and 0 < step < train.max_steps ({settings.max_steps})")


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
    (final is the curve's last point), named by TRL's optimiser step (``checkpoint-<k × step>``,
    stapo.core.schedule)."""
    every = study.workflow.eval_every
    if not every:
        return []
    train = study.train_settings(model, method)
    points = (train.max_steps - 1) // every
    if points > MAX_CURVE_POINTS:
        raise ValueError(f"workflow.eval_every ({every}) puts {points:,} checkpoints of train.max_steps "
                         f"{train.max_steps:,} on the accuracy curve; at most {MAX_CURVE_POINTS:,} (the paper's "
                         "has 150): raise eval_every")
    k = optimizer_steps_per_rollout(train)
    return [f"checkpoint-{n * k}" for n in range(every, train.max_steps, every)]
