"""The study model: one YAML file (configs/paper.yaml, configs/tiny.yaml), read and validated here for every stage.

A study has six sections, each a dataclass whose fields are documented where they are defined:

    study     its name (results headings)
    models    key -> :class:`ModelEntry` (spec, GPUs, per-model ``train`` overrides, cluster resources)
    methods   key -> :class:`ObjectiveConfig` (stapo.losses' hyper-parameters; ``objective`` names the
    method;
              stapo/study/objective.py), and the method's own ``train`` overrides (its recipe: the paper's baselines
              "follow the parameter settings reported in their original papers")
    train     :class:`TrainSettings`, the shared RL recipe (stapo/study/train.py)
    eval      :class:`EvalSection`, the evaluation protocol (stapo/study/evaluation.py)
    workflow  :class:`WorkflowSection`, what the Snakemake workflow runs and the resources it asks for

:func:`parse` is the one validation: YAML syntax (:func:`load`, file:line:column), then the structure against the
JSON schema that stapo.study.schema generates from the section dataclasses (unknown keys at every level, types,
enums, the names of the declared methods; ``stapo schema`` prints it, and workflow/schemas/config.schema.yaml is that
printout), then every section's values (the dataclasses' checks) and the cross-section rules (every (model, method)
plan and its TRL batch split, model specs; the checkpoints the workflow evaluates, named or ``eval_every``, are ones
the run saves and keeps; a local ``eval.data_dir`` holds every evaluated benchmark). Modules: sections.py (models,
workflow, Study, Plan), train.py, objective.py, evaluation.py (their sections), schema.py, read.py (load, parse).
No torch: ``stapo train``, ``stapo eval``, ``stapo plan`` and the Snakefile (so ``snakemake -n``) run it before
any model loads, and any error is a :class:`StudyError` whose one line names the file and the key.
"""

from __future__ import annotations

from pathlib import Path

from stapo.study.evaluation import EvalSection
from stapo.study.objective import OBJECTIVES, ObjectiveConfig, get_objective
from stapo.study.read import (TRAIN_SECTIONS, check_schema, curve_checkpoints, default, load, load_files, overlay,
                              parse, read, resolve_plan, snapshot_steps)
from stapo.study.schema import SECTIONS, study_schema
from stapo.study.sections import ModelEntry, Plan, Study, StudyError, WorkflowSection, split_run
from stapo.study.train import TrainSettings, accumulation, train_settings

__all__ = ["SCHEMA", "SECTIONS", "StudyError", "Study", "ModelEntry", "WorkflowSection", "Plan", "load", "load_files",
           "overlay", "parse", "read", "check_schema", "study_schema", "resolve_plan", "default", "curve_checkpoints",
           "snapshot_steps", "TRAIN_SECTIONS", "split_run", "EvalSection", "ObjectiveConfig", "OBJECTIVES",
           "get_objective", "TrainSettings", "train_settings", "accumulation"]

# the schema's printout in the workflow catalog (generated; the package does not read it)
SCHEMA = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"
