"""stapo.core.jsonl's one JSON-lines policy (re-exported by stapo.report.results) and its callers: blank lines, a torn
last line of a log, a malformed line inside a file, rows that are not objects; and stapo.report.results' run-file
loaders."""

from __future__ import annotations

import json
import logging
import re

import pytest

from stapo.report import results
from stapo.tasks.problems import DatasetError, read_rows
from stapo.core.errors import UserError
from stapo.core.jsonl import JsonlError, jsonl_records, read_jsonl
from stapo.tasks.registry import read_benchmark_file


def test_rows_in_order_blank_lines_skipped_line_numbers_kept(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"step": 1}\n\n   \n{"step": 2, "x": "é"}\r\n{"step": 3}\n', encoding="utf-8")
    assert read_jsonl(path) == [{"step": 1}, {"step": 2, "x": "é"}, {"step": 3}]
    assert [(r.line, r.text) for r in jsonl_records(path)] == [
        (1, '{"step": 1}'), (4, '{"step": 2, "x": "é"}'), (5, '{"step": 3}')]
    path.write_text("")
    assert read_jsonl(path) == []


def test_a_line_separator_inside_a_string_does_not_split_the_line(tmp_path):
    path = tmp_path / "a.jsonl"  # json.dumps(ensure_ascii=False) writes U+2028 raw; str.splitlines would cut there
    path.write_text(json.dumps({"t": "a\u2028b"}, ensure_ascii=False) + "\n", encoding="utf-8")
    assert read_jsonl(path) == [{"t": "a\u2028b"}]


def test_a_torn_last_line_of_a_log_is_skipped_with_a_warning_naming_file_and_line(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "lo')  # the writer was killed mid-line
    with caplog.at_level(logging.WARNING, logger="stapo.core.jsonl"):
        assert read_jsonl(path, appended=True) == [{"step": 1}, {"step": 2}]
    assert f"{path}:3: discarding a torn last line" in caplog.text
    with pytest.raises(JsonlError, match=rf"{re.escape(str(path))}:3: invalid JSON"):
        read_jsonl(path)  # a file written whole cannot be torn by a kill: the same line is damage


def test_a_malformed_line_is_an_error_naming_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\nGARBAGE\n{"step": 2}\n')
    for appended in (False, True):
        with pytest.raises(JsonlError, match=rf"{re.escape(str(path))}:2: invalid JSON \(Expecting value\)") as err:
            read_jsonl(path, appended=appended)
        assert (err.value.where, err.value.text) == (f"{path}:2", "GARBAGE")
        assert isinstance(err.value, UserError) and isinstance(err.value, ValueError)
    path.write_text('{"step": 1}\n{"step": 2, "lo\n')  # its newline was written: not torn, damaged
    with pytest.raises(JsonlError, match=r"metrics\.jsonl:2: invalid JSON"):
        read_jsonl(path, appended=True)


def test_rows_that_are_not_objects_and_bytes_that_are_not_utf8_are_errors(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"step": 1}\n[1, 2]\n')
    with pytest.raises(JsonlError, match=r"a\.jsonl:2: not a JSON object \(a list\)"):
        read_jsonl(path)
    path.write_text('{"step": 1}\n3')  # parses: not a torn object, a wrong row
    with pytest.raises(JsonlError, match=r"a\.jsonl:2: not a JSON object \(a int\)"):
        read_jsonl(path, appended=True)
    path.write_bytes('{"p": "café"}\n'.encode("latin-1"))
    with pytest.raises(JsonlError, match=r"a\.jsonl:1: not UTF-8 text \(byte 10"):
        read_jsonl(path)


def test_callers_keep_their_error_types(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"problem": "p", "answer": "1"}\n{"problem": "q", "answer": "2"')
    with pytest.raises(DatasetError, match=r"rows\.jsonl:2: invalid JSON"):
        read_rows(path)  # a dataset is written whole: its torn tail is an error
    with pytest.raises(ValueError, match=r"rows\.jsonl:2: invalid JSON"):
        read_benchmark_file(path)


def test_load_metrics_skips_a_torn_tail_and_keeps_the_last_row_per_step(tmp_path):
    run = tmp_path / "runs" / "m" / "stapo"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 2, "a": 1}\n{"step": 1}\n{"step": 2, "a": 2}\n{"ste')
    assert results.load_metrics(tmp_path / "runs") == {("m", "stapo"): [{"step": 1}, {"step": 2, "a": 2}]}
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"no_step": 1}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl:2: bad line \(need a JSON object with 'step'\)"):
        results.load_metrics(tmp_path / "runs")


def test_load_examples_reads_each_seed_in_turn(tmp_path):
    for seed, token in ((0, "a"), (1, "b")):
        run = tmp_path / "m" / "stapo" / f"seed{seed}"
        run.mkdir(parents=True)
        (run / "silenced_examples.jsonl").write_text(json.dumps({"step": 1, "token": token}) + "\n")
    assert results.load_examples(tmp_path) == {("m", "stapo"): [{"step": 1, "token": "a"},
                                                                {"step": 1, "token": "b"}]}
