"""stapo.fields: one declaration of a config field gives its documentation, its schema and the reader's key check."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import jsonschema
import pytest

from stapo.fields import check_keys, doc, from_mapping, option, schema_of


class Mode(str, enum.Enum):
    A = "a-mode"
    B = "b-mode"


@dataclass(frozen=True)
class Section:
    """A test section."""

    name: str = option(help="the name")
    steps: int = option(3, "how many steps", minimum=1)
    rate: float | None = option(None, "a rate, or none")
    mode: Mode = option(Mode.A, "which mode")
    seeds: list[int] = option(help="seeds", default_factory=lambda: [0], minItems=1)
    where: str | list[str] = option("none", "one or several places")


def test_schema_of_types_enums_defaults_and_extra_keywords():
    schema = schema_of(Section, required=["name"])
    props = schema["properties"]
    assert schema["additionalProperties"] is False and schema["required"] == ["name"]
    assert props["name"] == {"type": "string", "description": "the name"}
    assert props["steps"] == {"type": "integer", "minimum": 1, "description": "how many steps", "default": 3}
    assert props["rate"]["type"] == ["number", "null"] and props["rate"]["default"] is None
    assert props["mode"] == {"type": "string", "enum": ["a-mode", "b-mode"], "description": "which mode",
                             "default": "a-mode"}
    assert props["seeds"] == {"type": "array", "items": {"type": "integer"}, "minItems": 1, "description": "seeds",
                              "default": [0]}
    assert props["where"]["type"] == ["string", "array"] and props["where"]["items"] == {"type": "string"}
    validator = jsonschema.Draft202012Validator(schema)
    assert validator.is_valid({"name": "x", "steps": 2, "mode": "b-mode", "where": ["p", "q"]})
    assert not validator.is_valid({"name": "x", "mode": "c-mode"})
    assert not validator.is_valid({"name": "x", "steps": 0})
    assert not validator.is_valid({"name": "x", "stpes": 2})
    assert doc(Section, "rate") == "a rate, or none"


def test_from_mapping_names_the_unknown_key():
    assert from_mapping(Section, {"name": "x", "steps": 5}, "sec") == Section(name="x", steps=5)
    with pytest.raises(ValueError, match=r"^sec\.stpes: unknown key; expected one of \['mode', 'name', 'rate', "
                                         r"'seeds', 'steps', 'where'\]$"):
        from_mapping(Section, {"name": "x", "stpes": 5}, "sec")
    with pytest.raises(ValueError, match=r"^sec\.a: unknown key; .* \(\+1 more\)$"):
        from_mapping(Section, {"name": "x", "b": 1, "a": 2}, "sec")
    # keys the caller reads itself pass, and do not reach the dataclass
    assert from_mapping(Section, {"name": "x", "label": "X"}, "sec", ignore=("label",)).name == "x"
    with pytest.raises(ValueError, match=r"^k: unknown key"):
        check_keys({"k": 1}, {"j"}, "")


def test_every_option_is_documented():
    with pytest.raises(ValueError, match="documented"):
        option(1)
