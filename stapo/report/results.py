"""The one reader of runs/ and scores/: what ``stapo report`` reads, as Score records and per-step rows.

JSON lines: every ``.jsonl`` here, as everywhere in the project, is read by :func:`read_jsonl` /
:func:`jsonl_records` under one policy (stapo.core.jsonl, re-exported here; a leaf module, as stapo.tasks.problems and
stapo.tasks.registry, which stapo.study.names imports, read JSON lines too).

The report's inputs (:func:`load_scores`, :func:`load_metrics`, :func:`load_run_protocols`,
:func:`load_examples`, and the paper's numbers, :func:`load_paper`):
    scores/<model>/<method>/<ckpt>/<benchmark>/<setting>.summary.json   one evaluation (``stapo eval``)
    scores/<model>/<method>/seed<k>/<ckpt>/<benchmark>/<setting>.*      one seed's (stapo.report.seeds)
    runs/<model>/<method>[/seed<k>]/metrics.jsonl                        one line per optimiser step
    runs/<model>/<method>[/seed<k>]/diagnostics.jsonl, silenced_examples.jsonl   token diagnostics
    runs/<model>/<method>[/seed<k>]/config.yaml                          the run's recorded config (stapo.train.rundir)
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from stapo.report import seeds
from stapo.core.jsonl import JsonlError, JsonlRecord, jsonl_records, read_jsonl
from stapo.study.names import BENCHMARKS, METHODS, MODELS, SETTINGS
from stapo.eval.scoring import DamagedScores
from stapo.report.seed_statistics import seed_cell

__all__ = ["JsonlError", "JsonlRecord", "jsonl_records", "read_jsonl", "Score", "load_scores", "load_metrics",
           "load_paper", "load_run_protocols", "load_examples", "RUN_PROTOCOL_KEYS", "PAPER_CSV"]

PAPER_CSV = Path(__file__).parents[1] / "reference" / "paper_v2_table.csv"


# ---------------------------------------------------------------------------------------------- scores


@dataclass(frozen=True)
class Score:
    """One evaluation: accuracy avg@n (%) and its 95 % CI."""

    model: str
    method: str
    ckpt: str
    benchmark: str
    setting: str
    accuracy: float
    ci_lo: float
    ci_hi: float
    n_samples: int | None = None
    problems: int | None = None
    rule_accuracy: float | None = None  # strict rule grade (== accuracy without a verifier)
    corrected_accuracy: float | None = None  # rule grade corrected by the LLM verifier (None: no verifier)
    fallback_accuracy: float | None = None  # the lenient fallback diagnostic
    truncation_rate: float | None = None  # % of samples that hit max_new_tokens
    no_box_rate: float | None = None  # % of samples without a final \boxed{}
    protocol: str | None = None  # eval.protocol of the evaluation (None: a summary from before it was recorded)
    verifier_model: str | None = None  # the LLM verifier that corrected it (None: rule grading only)
    n_seeds: int = 1  # several: the mean over seeds, its CI over seeds and problems (stapo.report.seeds)
    rule_stage: str | None = None  # the rule stage rule_accuracy is (stapo.eval.scoring.RULE_STAGES; None: math-verify,
    #                                from before the summary recorded it)
    rule_justrl: float | None = None  # each rule stage's avg@n (None: not recorded)
    rule_harness: float | None = None
    rule_moved: int | None = None  # samples on which the two rule stages disagree


def load_scores(scores_dir: str | Path) -> list[Score]:
    """Every ``<model>/<method>/<ckpt>/<benchmark>/<setting>.summary.json`` under ``scores_dir``, and one cell per
    (model, method, ckpt, benchmark, setting) of a several-seed study's ``<model>/<method>/seed<k>/...``: the mean
    over seeds with its CI over seeds and problems (:func:`_across_seeds`)."""
    scores = []
    for path in sorted(Path(scores_dir).glob("*/*/*/*/*.summary.json")):
        scores.append(_read_summary(path, *path.relative_to(scores_dir).parts[:4]))
    per_seed: dict[tuple, list[Score]] = {}
    for path in sorted(Path(scores_dir).glob("*/*/seed*/*/*/*.summary.json")):
        model, method, _, ckpt, benchmark = path.relative_to(scores_dir).parts[:5]
        score = _read_summary(path, model, method, ckpt, benchmark)
        per_seed.setdefault((model, method, ckpt, benchmark, score.setting), []).append(score)
    return scores + _across_seeds(scores_dir, per_seed)


def _read_summary(path: Path, model: str, method: str, ckpt: str, benchmark: str) -> Score:
    setting = path.name[: -len(".summary.json")]
    try:
        s = json.loads(path.read_text(encoding="utf-8"))
        rule = float(s["avg_at_n"])
        corrected = s.get("avg_at_n_corrected")
        acc = rule if corrected is None else float(corrected)  # the paper reports verifier-corrected
        ci = (s.get("ci95") if corrected is None else s.get("ci95_corrected")) or (acc, acc)
        lo, hi = (float(v) for v in ci)
    except (ValueError, KeyError, TypeError) as e:
        raise DamagedScores(f"{path}: not a score summary (need avg_at_n and ci95): {e}") from None
    verifier = (s.get("verifier") or {}).get("model") if corrected is not None else None
    generation = s.get("generation") or {}
    protocol = generation.get("protocol")
    if protocol and generation.get("worked_example"):  # eval.worked_example (the CPU miniature's prompt)
        protocol += " + worked example"
    return Score(model, method, ckpt, benchmark, setting, acc, lo, hi, s.get("n_samples"), s.get("problems"), rule,
                 None if corrected is None else acc, s.get("avg_at_n_fallback"), s.get("truncation_rate"),
                 s.get("no_box_rate"), protocol, verifier, rule_stage=s.get("rule_stage"),
                 rule_justrl=s.get("avg_at_n_justrl"), rule_harness=s.get("avg_at_n_harness"),
                 rule_moved=s.get("rule_moved"))


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _across_seeds(scores_dir, per_seed: dict[tuple, list[Score]]) -> list[Score]:
    """One Score per several-seed cell: accuracy = mean over seeds and problems of the per-sample verdicts, CI
    from the two-stage bootstrap (stapo.report.seed_statistics); rates: the seeds' mean."""
    if not per_seed:
        return []
    cells = seeds.seed_cells(scores_dir)
    out = []
    for key, group in per_seed.items():
        samples = cells.get(key)
        if samples is None:
            where = f"{scores_dir}/{key[0]}/{key[1]}/seed*/{key[2]}/{key[3]}/{key[4]}.jsonl"
            raise DamagedScores(f"{where}: the per-sample files of a several-seed cell are missing (its summaries "
                                "are there)")
        head, rule = seed_cell(samples.headline), seed_cell(samples.rule)
        out.append(Score(*key, head.mean, head.lo, head.hi, group[0].n_samples, group[0].problems, rule.mean,
                         head.mean if samples.corrected is not None else None,
                         _mean(g.fallback_accuracy for g in group), _mean(g.truncation_rate for g in group),
                         _mean(g.no_box_rate for g in group), group[0].protocol, group[0].verifier_model,
                         n_seeds=len(samples.seeds), rule_stage=group[0].rule_stage,
                         rule_justrl=_mean(g.rule_justrl for g in group),
                         rule_harness=_mean(g.rule_harness for g in group),
                         rule_moved=None if any(g.rule_moved is None for g in group)
                         else sum(g.rule_moved for g in group)))
    return out


def load_paper(path: str | Path = PAPER_CSV) -> dict[tuple[str, str, str, str], float]:
    """The paper's v2 Table 2 in our keys: ``(model, method, benchmark|'avg', setting) -> accuracy``.

    The file names models, methods, benchmarks and settings by their paper keys (``stapo.study.names``, ``Name.paper``);
    a name the registry does not know is an error (naming the file and the row).
    """
    ours = {field: {n.paper: n.key for n in registry.values() if n.paper} for field, registry in
            (("model", MODELS), ("method", METHODS), ("benchmark", BENCHMARKS), ("setting", SETTINGS))}
    ours["benchmark"]["avg"] = "avg"
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    paper = {}
    for i, r in enumerate(rows, 2):
        unknown = [f"{field} {r[field]!r}" for field in ours if r[field] not in ours[field]]
        if unknown:
            raise ValueError(f"{path}:{i}: {', '.join(unknown)} not in stapo.study.names")
        paper[tuple(ours[field][r[field]] for field in ours)] = float(r["accuracy"])
    return paper


# ---------------------------------------------------------------------------------------------- runs


def _run_files(runs_dir: str | Path, name: str) -> list[Path]:
    """``runs/<model>/<method>/<name>`` and each seed's ``runs/<model>/<method>/seed<k>/<name>``, sorted."""
    return sorted([*Path(runs_dir).glob(f"*/*/{name}"), *Path(runs_dir).glob(f"*/*/seed*/{name}")])


def load_metrics(runs_dir: str | Path, name: str = "metrics.jsonl") -> dict[tuple[str, str], list[dict]]:
    """``(model, run) -> [rows of runs/<model>/<run>/<name> per step]`` sorted by step, a run being a method or
    ``<method>/seed<k>`` (several seeds); a resumed run's repeated steps keep the last."""
    out = {}
    for path in _run_files(runs_dir, name):
        by_step = {}
        for record in jsonl_records(path, appended=True):
            try:
                by_step[int(record.row["step"])] = record.row
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{record.line}: bad line (need a JSON object with 'step'): {e}") from e
        model, *run = path.relative_to(runs_dir).parts[:-1]  # run: [method] or [method, seed<k>]
        out[(model, "/".join(run))] = [by_step[k] for k in sorted(by_step)]
    return out


def load_examples(runs_dir: str | Path) -> dict[tuple[str, str], list[dict]]:
    """``(model, method) -> [silenced_examples.jsonl rows]``: several seeds' examples in turn, under the method."""
    out = {}
    for path in _run_files(runs_dir, "silenced_examples.jsonl"):
        model, method = path.relative_to(runs_dir).parts[:2]
        out.setdefault((model, method), []).extend(read_jsonl(path, appended=True))
    return out


# The training protocol a table's runs were made with (runs/<model>/<method>/config.yaml, stapo.train.rundir), as
# (footnote label, section, key). trl.normaliser is optional: configs written before it existed lack it.
RUN_PROTOCOL_KEYS = (("loss_agg_mode", "method", "loss_agg_mode"), ("quantile_scope", "method", "quantile_scope"),
                     ("train.prompt", "train", "prompt"), ("trl.normaliser", "trl", "normaliser"))


def load_run_protocols(runs_dir: str | Path) -> dict[tuple[str, str], dict[str, str] | None]:
    """``(model, method) -> {label: value}`` of ``RUN_PROTOCOL_KEYS`` from each run's recorded config.yaml (a key
    the config lacks reads "not recorded"; the seeds of a several-seed study that disagree read "a | b"); None for
    a run directory without a readable config.yaml."""
    out: dict[tuple[str, str], dict[str, str] | None] = {}
    for path in _run_files(runs_dir, "config.yaml"):
        model, method = path.relative_to(runs_dir).parts[:2]
        try:
            config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError):
            out[(model, method)] = None
            continue
        values = {label: ("not recorded" if key not in (config.get(section) or {}) else str(config[section][key]))
                  for label, section, key in RUN_PROTOCOL_KEYS}
        if (config.get("train") or {}).get("worked_example"):  # the CPU miniature's prompt: say it was shown
            values["train.prompt"] += " + worked example"
        if (model, method) in out and out[(model, method)] is not None:  # another seed of the method
            seen = out[(model, method)]
            values = {k: v if v in seen[k].split(" | ") else f"{seen[k]} | {v}" for k, v in values.items()}
        if (model, method) not in out or out[(model, method)] is not None:
            out[(model, method)] = values
    return out
