"""Reading and checking a study file (configs/*.yaml): the same checks for ``stapo train`` and the workflow.

Two layers, both failing with one line that names the file, key or line (:class:`StudyError`):
    1. :func:`load` / :func:`check_schema`: YAML syntax (file:line:column), then the JSON schema of the whole
       study, ``workflow/schemas/config.schema.yaml`` (unknown keys at every strict level, including the top
       level, enums, types). Cheap: no torch.
    2. :func:`check_plans`: every (model, method) the study trains goes through :func:`stapo.trainer.resolve_plan`,
       the owner of the ``train`` and method-parameter rules, and every model spec through
       :func:`stapo.models.check_spec`. This imports the trainer (torch, TRL: seconds).
``stapo train`` runs layer 1 before importing torch and layer 2 before loading any model; the Snakefile runs
both on parse, so ``snakemake -n`` rejects what ``stapo train`` would.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from stapo.errors import UserError

__all__ = ["SCHEMA", "StudyError", "load", "check_schema", "check_keys", "check_plans", "TRAIN_SECTIONS"]

SCHEMA = Path(__file__).resolve().parents[1] / "workflow" / "schemas" / "config.schema.yaml"
TRAIN_SECTIONS = ("models", "methods", "train")  # what a `stapo train --recipe` file must hold
_MAX = 160  # characters of an offending value quoted in a message


class StudyError(UserError):
    """A bad study file; the message is one line naming the file and the key (or line)."""


def load(path: str | os.PathLike) -> dict:
    """The mapping in a YAML file; StudyError for a missing file, a syntax error (file:line:col) or a non-mapping."""
    path = Path(path)
    if not path.is_file():
        raise StudyError(f"{path}: file not found")
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise StudyError(f"{where}: YAML syntax error: {problem}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise StudyError(f"{path}: expected a mapping of sections (study, models, methods, train, eval, workflow), "
                         f"got {type(doc).__name__}")
    return doc


def _schema() -> dict:
    return yaml.safe_load(SCHEMA.read_text(encoding="utf-8"))


def _message(err) -> str:
    """One line for a jsonschema error: the dotted key, then what is wrong with it."""
    path = ".".join(str(p) for p in err.absolute_path)
    if err.validator == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        unknown = sorted(set(err.instance) - set(allowed))
        key = f"{path}.{unknown[0]}" if path and unknown else (unknown[0] if unknown else path)
        return f"{key}: unknown key" + (f"; expected one of {allowed}" if allowed else "")
    if err.validator == "propertyNames":
        return f"{path}: {err.message[:_MAX]}" if path else err.message[:_MAX]
    if err.validator == "required":
        return f"{path or 'top level'}: {err.message}"
    return f"{path or 'top level'}: {err.message[:_MAX]}"


def check_schema(config: dict, *, source: str = "config", required: tuple[str, ...] | None = None) -> None:
    """Validate ``config`` against the study schema; StudyError names the first bad key (and how many more).

    ``required`` replaces the schema's top-level required sections (``stapo train`` needs only TRAIN_SECTIONS).
    """
    import jsonschema

    schema = _schema()
    if required is not None:
        schema["required"] = list(required)
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        first = jsonschema.exceptions.best_match(errors)
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        raise StudyError(f"{source}: {_message(first)}{more}")


def check_keys(config: dict, model: str | None, method: str | None, *, source: str = "config") -> None:
    """The model and method keys a command names exist in the study (StudyError otherwise)."""
    for section, key in (("models", model), ("methods", method)):
        if key is not None and key not in config.get(section, {}):
            raise StudyError(f"{source}: {section}: no {key!r}; the study defines {sorted(config.get(section, {}))}")


def check_plans(config: dict, models, methods, *, source: str = "config") -> None:
    """Resolve every (model, method) plan, its TRL batch split (one process per GPU of models.<key>.gpus) and every
    model spec, as ``stapo train`` will; StudyError."""
    from stapo.models import check_spec
    from stapo.trainer import accumulation, resolve_plan

    for model in models:
        try:
            check_spec(str(config["models"][model]["spec"]))
        except (ValueError, OSError) as err:
            raise StudyError(f"{source}: models.{model}.spec: {err}") from None
        for method in methods:
            try:
                plan = resolve_plan(config, model, method)
                accumulation(plan.settings, max(1, int(config["models"][model].get("gpus") or 0)))
            except (ValueError, TypeError) as err:
                raise StudyError(f"{source}: {err}") from None
