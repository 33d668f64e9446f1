"""Config dataclasses declared once: documented fields, the one mapping -> dataclass reader, and their JSON schema.

A config section is a dataclass whose fields carry their own documentation (TRL's ``field(metadata={"help": ...})``
style) and, where the type alone does not say it, extra JSON-schema keywords::

    max_steps: int = option(3000, "training steps, in rollout batches (paper: 3,000)", minimum=1)

From that one declaration:
    :func:`from_mapping`  builds the dataclass from a mapping (a YAML section), refusing an unknown key in one line
                          that names it (the same wording as the schema check of stapo.study.check_schema);
    :func:`schema_of`     the JSON schema of the dataclass: its keys, types (``int`` -> integer, ``X | None`` ->
                          [X, null], a ``str`` Enum -> its values), descriptions, and the extra keywords.
No stapo imports (stapo.data and stapo.plan read their mappings through here too).
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from dataclasses import MISSING

__all__ = ["option", "doc", "check_keys", "from_mapping", "schema_of"]

_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", dict: "object", list: "array",
               type(None): "null"}


def option(default=MISSING, help: str = "", *, default_factory=MISSING, **schema) -> dataclasses.Field:
    """A dataclass field documented by ``help`` (its description in the schema); ``schema``: extra JSON-schema
    keywords (``minimum``, ``enum``, ``items``, ...)."""
    if not help:
        raise ValueError("option(): every config field is documented (help=...)")
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata={"help": " ".join(help.split()), "schema": schema})


def doc(cls, name: str) -> str:
    """The documentation of field ``name`` of dataclass ``cls``."""
    return {f.name: f for f in dataclasses.fields(cls)}[name].metadata.get("help", "")


def check_keys(mapping: dict, allowed, where: str) -> None:
    """ValueError naming the first key of ``mapping`` not in ``allowed`` (and how many more), as
    ``<where>.<key>: unknown key; expected one of [...]``."""
    unknown = sorted(set(mapping) - set(allowed), key=str)
    if unknown:
        more = f" (+{len(unknown) - 1} more)" if len(unknown) > 1 else ""
        key = f"{where}.{unknown[0]}" if where else str(unknown[0])
        raise ValueError(f"{key}: unknown key; expected one of {sorted(allowed)}{more}")


def from_mapping(cls, mapping: dict | None, where: str, *, ignore=(), **given):
    """``cls(**mapping, **given)``, after refusing any key of ``mapping`` that is not a field of ``cls`` (nor in
    ``ignore``: keys the caller reads itself) with :func:`check_keys`."""
    mapping = dict(mapping or {})
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    check_keys(mapping, names | set(ignore), where)
    return cls(**{k: v for k, v in mapping.items() if k not in ignore}, **given)


def _type_schema(tp) -> dict:
    """The JSON-schema ``type`` (and ``enum`` / ``items``) of one Python annotation."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        parts = [_type_schema(a) for a in typing.get_args(tp)]
        out: dict = {"type": [t for p in parts for t in ([p["type"]] if isinstance(p["type"], str) else p["type"])]}
        for p in parts:
            out.update({k: v for k, v in p.items() if k != "type"})
        return out
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"type": "string", "enum": [m.value for m in tp]}
    if origin is list:
        args = typing.get_args(tp)
        return {"type": "array", **({"items": _type_schema(args[0])} if args else {})}
    base = origin or tp
    if base not in _JSON_TYPES:
        raise TypeError(f"no JSON-schema type for {tp!r}")
    return {"type": _JSON_TYPES[base]}


def _plain(value):
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _default(f: dataclasses.Field):
    if f.default is not MISSING:
        return _plain(f.default)
    if f.default_factory is not MISSING:
        value = f.default_factory()
        return _plain(value) if isinstance(value, (list, dict)) and len(str(value)) <= 200 else MISSING
    return MISSING


def schema_of(cls, *, drop=(), required=()) -> dict:
    """The JSON schema of dataclass ``cls``: an object of its fields (less ``drop``), no other key; each field's
    type, description (its ``help``), default and extra keywords. A field whose ``schema`` sets ``type`` replaces
    the annotation's."""
    hints = typing.get_type_hints(cls)
    props = {}
    for f in dataclasses.fields(cls):
        if f.name in drop or not f.init:
            continue
        extra = dict(f.metadata.get("schema", {}))
        prop = {} if "type" in extra else _type_schema(hints[f.name])
        prop.update(extra)
        if f.metadata.get("help"):
            prop["description"] = f.metadata["help"]
        default = _default(f)
        if default is not MISSING and "default" not in prop:
            prop["default"] = default
        props[f.name] = prop
    out = {"type": "object", "additionalProperties": False}
    if required:
        out["required"] = list(required)
    out["properties"] = props
    return out
