"""stapo.core.fields: one declaration of a config field gives its documentation, its schema and the reader's key
check."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import jsonschema
import pytest

from stapo.core.fields import Choice, check_fields, check_keys, doc, from_mapping, option, plain, schema_of


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


# ------------------------------------------------------------------------ Choice options and generic field checks


class Speed(Choice):
    SLOW = "slow"
    FAST = "fast"


@dataclass(frozen=True)
class Checked:
    """A section checked by check_fields: a choice, an optional choice and bounded numbers."""

    speed: Speed = option(Speed.SLOW, "a choice")
    maybe: Speed | None = option(None, "an optional choice")
    p: float = option(0.5, "in (0, 1)", exclusiveMinimum=0, exclusiveMaximum=1)
    c: float = option(3.0, "> 1", exclusiveMinimum=1)
    n: int = option(0, ">= 0", minimum=0)
    r: float = option(1.0, "in (0, 1]", exclusiveMinimum=0, maximum=1)

    def __post_init__(self):
        check_fields(self, "sec.")


def test_check_fields_coerces_choices_and_bounds_numbers():
    c = Checked(speed="fast", maybe="slow")
    assert c.speed is Speed.FAST and c.maybe is Speed.SLOW and Checked().maybe is None
    assert f"{c.speed}" == "fast" and str(c.speed) == "fast" and c.speed == "fast"  # a string everywhere
    assert plain({"s": [c.speed, (Speed.SLOW,)], "n": 1}) == {"s": ["fast", ["slow"]], "n": 1}
    for kwargs, message in [
            (dict(speed="medium"), "sec.speed: unknown value 'medium'; expected one of ['slow', 'fast']"),
            (dict(maybe="x"), "sec.maybe: unknown value 'x'; expected one of ['slow', 'fast']"),
            (dict(p=1.0), "sec.p: must be in (0, 1), got 1.0"), (dict(p=0), "sec.p: must be in (0, 1), got 0"),
            (dict(c=1.0), "sec.c: must be > 1, got 1.0"), (dict(n=-1), "sec.n: must be >= 0, got -1"),
            (dict(r=1.5), "sec.r: must be in (0, 1], got 1.5"), (dict(r=0.0), "sec.r: must be in (0, 1], got 0.0")]:
        with pytest.raises(ValueError) as err:
            Checked(**kwargs)
        assert str(err.value) == message
    assert Checked(p=0.999, c=1.001, n=0, r=1.0).r == 1.0  # the bounds themselves: inclusive or not as declared
    schema = schema_of(Checked)["properties"]
    assert schema["speed"]["enum"] == ["slow", "fast"] and schema["speed"]["default"] == "slow"
    assert (schema["p"]["exclusiveMinimum"], schema["r"]["maximum"]) == (0, 1)  # the same bounds in the schema


def test_options_with_behaviour_are_choices_compared_nowhere_by_their_strings():
    """aggregation, quantile scope, eval.protocol, train.prompt, eval backend, train.mini_batch: each a Choice field
    of its section (its values the schema's enum), and no module compares the option's value with a string literal
    (==, !=, in, case): the behaviour is its members'."""
    import re
    from pathlib import Path

    from stapo.study.objective import AggMode, ObjectiveConfig, QuantileScope
    from stapo.study.evaluation import Backend, EvalSection
    from stapo.study.train import MiniBatch, TrainSettings
    from stapo.tasks.problems import EvalProtocol, TrainPrompt

    options = {(ObjectiveConfig, "loss_agg_mode"): AggMode, (ObjectiveConfig, "quantile_scope"): QuantileScope,
               (EvalSection, "protocol"): EvalProtocol, (EvalSection, "backend"): Backend,
               (TrainSettings, "prompt"): TrainPrompt, (TrainSettings, "mini_batch"): MiniBatch}
    for (section, name), choice in options.items():
        assert issubclass(choice, Choice)
        assert schema_of(section)["properties"][name]["enum"] == [m.value for m in choice]
    values = "|".join(re.escape(m.value) for choice in options.values() for m in choice)
    literal = rf"[\"']({values})[\"']"
    pattern = re.compile(rf"(==|!=|\bin\b|\bnot in\b|\bcase\b)\s*\(?\s*{literal}|{literal}\s*(==|!=|\bin\b)")
    root = Path(__file__).resolve().parents[1] / "stapo"
    hits = [f"{p.relative_to(root)}:{i}: {line.strip()}" for p in sorted(root.rglob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []
    assert pattern.search('if cfg.backend == "hf":') and pattern.search('x = "groups" in modes')  # it can find them
