"""The JSON schema of a study file, generated from the section dataclasses (stapo.core.fields): their keys, types, enums
and descriptions are declared once, on the fields. The name enums come from the declarations (stapo/study/methods.py),
the numeric bounds from stapo.core.limits. ``stapo schema`` prints it as YAML; workflow/schemas/
config.schema.yaml is that output (tests/test_study.py keeps the two equal), for readers of the workflow catalog.
"""

from __future__ import annotations

import copy

import yaml

from stapo.study import names
from stapo.core.fields import schema_of
from stapo.core.limits import BOUNDS, MAX_SEEDS
from stapo.study import methods as declared  # read at call time: a method declared later is in the enum
from stapo.study.evaluation import BenchmarkEntry, EvalSection
from stapo.study.objective import ObjectiveConfig
from stapo.study.sections import KEY_PATTERN, KEY_RULE, ModelEntry, WorkflowSection
from stapo.study.train import TrainSettings

__all__ = ["SECTIONS", "study_schema", "dump"]

SECTIONS = ("study", "models", "methods", "train", "eval", "workflow")  # the top-level keys, in order
_KEYS = {"pattern": KEY_PATTERN, "$comment": KEY_RULE}


def _keyed(entry: dict, **names_) -> dict:
    """A mapping of directory-naming keys to ``entry``s."""
    return {"type": "object", "minProperties": 1, "propertyNames": {**_KEYS, **names_},
            "additionalProperties": entry}


def _train(description: str) -> dict:
    schema = schema_of(TrainSettings)
    schema["description"] = description
    return schema


def _methods() -> dict:
    entry = schema_of(ObjectiveConfig, drop={"method"}, required=["objective"])
    entry["properties"] = {
        "objective": {"type": "string", "enum": list(declared.METHODS),
                      "description": "a declared method (stapo/study/methods.py): its mask or loss and its defaults; "
                                     + ", ".join(f"{k} ({m.label})" for k, m in declared.METHODS.items())},
        "label": {"type": "string", "minLength": 1, "description": "what tables and figures show (default: the "
                  "method's)"},
        "train": _train("this method's overrides of the train section (its own recipe; checked as train is)"),
        **entry["properties"]}
    return _keyed(entry, **{"not": {"const": names.BASE}})


def _eval() -> dict:
    schema = schema_of(EvalSection, required=["benchmarks", "settings"])
    props = schema["properties"]
    props["benchmarks"]["additionalProperties"] = {**schema_of(BenchmarkEntry), "type": ["object", "null"]}
    props["benchmarks"].pop("default", None)
    setting = {"type": "object", "additionalProperties": False, "required": ["temperature", "top_p"],
               "properties": {"temperature": {"type": "number", "minimum": 0},
                              "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                              "label": {"type": "string", "minLength": 1, "description": "what tables and figures "
                                        "show (default T<temperature>)"}}}
    props["settings"].update(propertyNames=dict(_KEYS), additionalProperties=setting)
    return schema


def _bound_numbers(node) -> None:
    """Every integer / number property named in stapo.core.limits.BOUNDS gets that bound (the reason as its
    ``$comment``, which stapo.study's error messages quote). Not inside a ``train`` section: train_settings checks
    its bounds (stapo.core.limits.check_bound) for the section and its per-model / per-method overrides alike."""
    if not isinstance(node, dict):
        return
    for name, sub in (node.get("properties") or {}).items():
        if name == "train":
            continue
        types = sub.get("type") if isinstance(sub, dict) else None
        types = types if isinstance(types, list) else [types]
        if name in BOUNDS and {"integer", "number"} & set(types):
            bound = BOUNDS[name]
            sub.update(minimum=bound.minimum, maximum=bound.maximum, **{"$comment": bound.why})
        _bound_numbers(sub)
    for key in ("additionalProperties", "items"):
        _bound_numbers(node.get(key))


def study_schema() -> dict:
    """The study schema (a fresh copy: callers may edit it)."""
    models = _keyed(schema_of(ModelEntry, required=["spec"]))
    models["additionalProperties"]["properties"]["train"] = _train(
        "per-model overrides of the train section (checked as train is)")
    workflow = schema_of(WorkflowSection)
    workflow["default"] = {}
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "description": "STAPO study config (one file = train recipe + eval protocol + workflow); generated from the "
                       "section dataclasses of stapo/study/ by `stapo schema`",
        "type": "object", "additionalProperties": False, "required": ["study", "models", "methods", "train", "eval"],
        "properties": {
            "study": {"type": "string", "pattern": KEY_PATTERN, "description": "name of the study, used in results "
                      "headings"},
            "models": models, "methods": _methods(),
            "train": _train("the shared RL recipe (stapo.study.TrainSettings)"),
            "eval": _eval(), "workflow": workflow},
    }
    _bound_numbers(schema)
    seeds = schema["properties"]["workflow"]["properties"]["seeds"]
    seeds["items"].update(maximum=BOUNDS["seed"].maximum, **{"$comment": BOUNDS["seed"].why})
    seeds["maxItems"] = MAX_SEEDS
    assert list(schema["properties"]) == list(SECTIONS)
    return copy.deepcopy(schema)


def dump() -> str:
    """The schema as YAML (workflow/schemas/config.schema.yaml)."""
    head = ("# GENERATED by `stapo schema --out workflow/schemas/config.schema.yaml` from the section dataclasses of\n"
            "# stapo/study/: edit the fields there.\n")
    return head + yaml.safe_dump(study_schema(), sort_keys=False, width=120, allow_unicode=True)


def add_arguments(parser) -> None:
    parser.add_argument("--out", help="write it to this file (atomically) instead of standard output")


def run(args) -> int:
    """``stapo schema [--out FILE]``."""
    if args.out:
        from stapo.core.atomic import atomic_write

        atomic_write(args.out, dump())
    else:
        print(dump(), end="")
    return 0
