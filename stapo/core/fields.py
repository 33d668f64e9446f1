"""Config dataclasses declared once: documented fields, the one mapping -> dataclass reader, and their JSON schema.

A config section is a dataclass whose fields carry their own documentation (TRL's ``field(metadata={"help": ...})``
style) and, where the type alone does not say it, extra JSON-schema keywords::

    max_steps: int = option(3000, "training steps, in rollout batches (paper: 3,000)", minimum=1)

From that one declaration:
    :func:`from_mapping`  builds the dataclass from a mapping (a YAML section), refusing an unknown key in one line
                          that names it (the same wording as the schema check of stapo.study.check_schema);
    :func:`check_fields`  in the dataclass's ``__post_init__``: each :class:`Choice` field's string made its enum
                          member, each number checked against its schema bounds (``minimum``, ``maximum``,
                          ``exclusiveMinimum``, ``exclusiveMaximum``), in one line naming the key;
    :func:`schema_of`     the JSON schema of the dataclass: its keys, types (``int`` -> integer, ``X | None`` ->
                          [X, null], a ``str`` Enum -> its values), descriptions, and the extra keywords.

An option whose value has behaviour (an aggregation, an evaluation protocol, a backend ...) is a :class:`Choice`:
its members carry that behaviour, so no other module compares the option's string.
No stapo imports (stapo.tasks.problems and stapo.plan read their mappings through here too).
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from dataclasses import MISSING

__all__ = ["Choice", "option", "doc", "check_keys", "check_fields", "from_mapping", "schema_of", "plain"]

_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", dict: "object", list: "array",
               type(None): "null"}


class Choice(str, enum.Enum):
    """A config option's value with behaviour: compares, formats and serialises as its string (a YAML string parses
    into it; JSON and YAML dumps write its value); its subclasses' members carry what the value does."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


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


def _choice_type(tp):
    """The Choice subclass of an annotation (``X``, ``X | None``), or None."""
    args = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
    return next((a for a in args if isinstance(a, type) and issubclass(a, Choice)), None)


_BOUNDS = (("minimum", lambda v, b: v >= b), ("exclusiveMinimum", lambda v, b: v > b),
           ("maximum", lambda v, b: v <= b), ("exclusiveMaximum", lambda v, b: v < b))


def _bound_text(schema: dict) -> str:
    low = ("[", schema["minimum"]) if "minimum" in schema else ("(", schema.get("exclusiveMinimum"))
    high = ("]", schema["maximum"]) if "maximum" in schema else (")", schema.get("exclusiveMaximum"))
    if low[1] is not None and high[1] is not None:
        return f"in {low[0]}{low[1]:g}, {high[1]:g}{high[0]}"
    if low[1] is not None:
        return f"{'>=' if low[0] == '[' else '>'} {low[1]:g}"
    return f"{'<=' if high[0] == ']' else '<'} {high[1]:g}"


def check_fields(obj, where: str = "") -> None:
    """For a (frozen) config dataclass, in its ``__post_init__``: every field typed as a :class:`Choice` becomes its
    member (ValueError ``<where><key>: unknown value 'x'; expected one of [...]``), and every number is checked
    against its field's schema bounds (ValueError ``<where><key>: must be in (0, 1), got 1.5``)."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value, key = getattr(obj, f.name), f"{where}{f.name}"
        choice = _choice_type(hints[f.name])
        if choice is not None and value is not None and not isinstance(value, choice):
            if value not in [m.value for m in choice]:
                raise ValueError(f"{key}: unknown value {value!r}; expected one of {[m.value for m in choice]}")
            object.__setattr__(obj, f.name, choice(value))  # frozen: coerce the YAML string once, here
        schema = f.metadata.get("schema", {})
        if isinstance(value, (int, float)) and not isinstance(value, bool) and any(k in schema for k, _ in _BOUNDS):
            if not all(ok(value, schema[k]) for k, ok in _BOUNDS if k in schema):
                raise ValueError(f"{key}: must be {_bound_text(schema)}, got {value}")


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


def plain(value):
    """``value`` with every enum member replaced by its value (lists, tuples, dicts walked): what YAML dumps."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def _default(f: dataclasses.Field):
    if f.default is not MISSING:
        return plain(f.default)
    if f.default_factory is not MISSING:
        value = f.default_factory()
        return plain(value) if isinstance(value, (list, dict)) and len(str(value)) <= 200 else MISSING
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
