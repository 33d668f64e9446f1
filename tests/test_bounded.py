"""stapo.core.bounded: every reader refuses, in one line naming the file, a device, a FIFO, a file over its cap,
nesting over the depth cap (before a parser recurses) and a YAML key given twice."""

from __future__ import annotations

import os

import pytest

from stapo.core import bounded, limits
from stapo.core.bounded import BadFile


def _one_line(err, *texts):
    message = str(err.value)
    assert "\n" not in message and all(t in message for t in texts), message


@pytest.mark.parametrize("path, kind", [("/dev/zero", "character device"), ("/", "directory")])
def test_devices_and_directories_are_refused(path, kind):
    with pytest.raises(BadFile) as err:
        bounded.read_bytes(path, 100, "a summary")
    _one_line(err, path, kind, "a summary")


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(BadFile) as err:
        bounded.read_text(fifo, 100)
    _one_line(err, str(fifo), "FIFO")


def test_the_cap_is_read_at_call_time(tmp_path, monkeypatch):
    path = tmp_path / "s.json"
    path.write_text('{"a": 1}')
    assert bounded.load_json(path) == {"a": 1}
    monkeypatch.setattr(limits, "MAX_JSON_BYTES", 5)
    with pytest.raises(BadFile) as err:
        bounded.load_json(path, what="a summary")
    _one_line(err, str(path), "larger than 5 bytes", "a summary")


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"a": ' * 70 + "1" + "}" * 70])
def test_json_nesting_is_capped_before_parsing(text):
    with pytest.raises(BadFile) as err:
        bounded.parse_json(text, "f.json")
    _one_line(err, "f.json", f"more than {limits.MAX_DEPTH} levels")


def test_brackets_inside_strings_are_not_nesting():
    text = '{"a": "' + "[" * 500 + '"}'
    assert bounded.parse_json(text, "f") == {"a": "[" * 500}


def test_a_huge_integer_names_the_file():
    with pytest.raises(BadFile) as err:
        bounded.parse_json('{"answer": ' + "9" * 100_000 + "}", "bench.jsonl:3")
    _one_line(err, "bench.jsonl:3", "4300 digits")


@pytest.mark.parametrize("text", ["x: " + "[" * 10_000 + "]" * 10_000, "x: " + "{a: " * 10_000,
                                  "x:\n" + "".join(" " * i + "- \n" for i in range(1, 200))])
def test_yaml_nesting_is_capped_before_composing(text):
    with pytest.raises(BadFile) as err:
        bounded.parse_yaml(text, "study.yaml")
    _one_line(err, "study.yaml", "levels deep")


def test_a_duplicate_yaml_key_is_refused_with_its_line():
    with pytest.raises(BadFile) as err:
        bounded.parse_yaml("train:\n  max_steps: 4\n  max_steps: 5\n", "s.yaml")
    _one_line(err, "s.yaml:3:3", "duplicate key 'max_steps'")


def test_merge_keys_may_still_override():
    assert bounded.parse_yaml("a: &x {b: 1}\nc:\n  <<: *x\n  b: 2\n", "s") == {"a": {"b": 1}, "c": {"b": 2}}
