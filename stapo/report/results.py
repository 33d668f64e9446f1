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
import math
from dataclasses import dataclass
from pathlib import Path

from stapo.report import seeds
from stapo.core import bounded, limits
from stapo.core.jsonl import JsonlError, JsonlRecord, jsonl_records, read_jsonl
from stapo.core.lock import RUN_LOCK, in_use
from stapo.study.names import BENCHMARKS, METHODS, MODELS, SETTINGS
from stapo.eval.scoring import DamagedScores, read_samples
from stapo.report.seed_statistics import seed_cell
from stapo.tasks.registry import HUB, load_rows

__all__ = ["JsonlError", "JsonlRecord", "jsonl_records", "read_jsonl", "Score", "load_scores", "read_scores_csv",
           "expected_cells", "StillRunning", "load_metrics", "load_paper", "load_run_protocols", "load_examples",
           "RUN_PROTOCOL_KEYS", "PAPER_CSV"]

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


def read_scores_csv(path: str | Path) -> list[Score]:
    """The evaluated cells of a report's scores.csv (stapo.report.table.render_csv) as :class:`Score`s, the rows'
    averages (benchmark ``avg``) left out: what a committed scores.csv re-renders from (the README's demo table,
    tests/test_readme.py). Values are the file's (4 decimals)."""
    num = lambda v: float(v) if v else None  # noqa: E731
    with open(path, newline="", encoding="utf-8") as f:
        return [Score(model=r["model"], method=r["method"], ckpt=r["ckpt"], benchmark=r["benchmark"],
                      setting=r["setting"], accuracy=float(r["accuracy"]), ci_lo=float(r["ci95_lo"]),
                      ci_hi=float(r["ci95_hi"]), n_samples=int(r["n_samples"]) if r["n_samples"] else None,
                      problems=int(r["problems"]) if r["problems"] else None, rule_accuracy=num(r["rule_accuracy"]),
                      corrected_accuracy=num(r["corrected_accuracy"]), fallback_accuracy=num(r["fallback_accuracy"]),
                      truncation_rate=num(r["truncation_rate"]), no_box_rate=num(r["no_box_rate"]),
                      protocol=r["protocol"] or None, verifier_model=r["verifier"] or None,
                      n_seeds=int(r["n_seeds"] or 1), rule_stage=r["rule_stage"] or None,
                      rule_justrl=num(r["rule_accuracy_justrl"]), rule_harness=num(r["rule_accuracy_harness"]),
                      rule_moved=int(r["rule_moved_samples"]) if r["rule_moved_samples"] else None)
                for r in csv.DictReader(f) if r["benchmark"] != "avg"]


class StillRunning(DamagedScores):
    """An evaluation output or run directory whose lock a living process holds: what it wrote is not final."""


@dataclass(frozen=True)
class Expected:
    """What a study's evaluation of one benchmark asks for: problems (its rows after its limit), samples each, and
    the seeds of a trained run (None: not known, not checked)."""

    problems: int | None
    n_samples: int | None
    seeds: tuple[int, ...] | None = None


def expected_cells(study) -> dict[str, Expected]:
    """benchmark -> :class:`Expected` of every benchmark of ``study``'s eval section (a hub benchmark's rows are
    not counted: that would need the network)."""
    section, out = study.eval, {}
    seeds_ = tuple(study.workflow.seeds) if study.workflow.seeds and len(study.workflow.seeds) > 1 else None
    for bench in section.benchmarks:
        entry, problems = section.benchmark(bench), None
        if not (section.data_dir == HUB and section.uses_data_dir(bench)):
            rows = load_rows(bench, section.data_dir, file=entry.file, n=entry.n, seed=entry.seed,
                             difficulty=entry.difficulty)
            limit = entry.limit if entry.limit is not None else section.limit
            problems = len(rows) if limit is None else min(limit, len(rows))
        out[bench] = Expected(problems, section.samples(bench), seeds_)
    return out


def load_scores(scores_dir: str | Path, expected: dict[str, Expected] | None = None) -> list[Score]:
    """Every ``<model>/<method>/<ckpt>/<benchmark>/<setting>.summary.json`` under ``scores_dir``, and one cell per
    (model, method, ckpt, benchmark, setting) of a several-seed study's ``<model>/<method>/seed<k>/...``: the mean
    over seeds with its CI over seeds and problems (:func:`_across_seeds`).

    Every cell is verified before its number is used (:func:`_verify_cell`): its per-sample file is there, matches
    the digest and counts its summary recorded, holds the problems and samples ``expected`` (a study's, by
    benchmark) asks for, and no living evaluation holds its lock; a several-seed cell has every seed. Anything
    else is a DamagedScores naming the file."""
    scores = []
    for path in sorted(Path(scores_dir).glob("*/*/*/*/*.summary.json")):
        score = _read_summary(path, *path.relative_to(scores_dir).parts[:4])
        _verify_cell(path, score, (expected or {}).get(score.benchmark))
        scores.append(score)
    per_seed: dict[tuple, dict[int, Score]] = {}
    for path in sorted(Path(scores_dir).glob("*/*/seed*/*/*/*.summary.json")):
        model, method, seed_dir, ckpt, benchmark = path.relative_to(scores_dir).parts[:5]
        if not seed_dir.removeprefix("seed").isdigit():
            continue
        score = _read_summary(path, model, method, ckpt, benchmark)
        _verify_cell(path, score, (expected or {}).get(score.benchmark), samples=False)
        per_seed.setdefault((model, method, ckpt, benchmark, score.setting), {})[int(seed_dir[4:])] = score
    return scores + _across_seeds(scores_dir, per_seed, expected or {})


def _samples_of(summary: Path) -> Path:
    return summary.with_name(summary.name.removesuffix(".summary.json") + ".jsonl")


def _verify_cell(summary: Path, score: Score, expected: Expected | None, samples: bool = True) -> None:
    """One evaluation's numbers may be printed: no writer holds it, its per-sample file matches its summary
    (stapo.eval.scoring.read_samples: digest, lines) and holds the problems and samples the study asks for.
    ``samples=False``: the lock and the counts only (a seed's file is read by stapo.report.seeds)."""
    path = _samples_of(summary)
    who = in_use(path.with_name(path.name + ".lock"))
    if who:
        raise StillRunning(f"{path}: its evaluation is still running ({who}); report once it has finished")
    if expected is not None and expected.problems is not None and score.problems != expected.problems:
        raise DamagedScores(f"{summary}: {score.problems} problems; the study's evaluation of {score.benchmark} "
                            f"asks for {expected.problems} (its rows after eval.limit): rerun it")
    if expected is not None and expected.n_samples is not None and score.n_samples != expected.n_samples:
        raise DamagedScores(f"{summary}: {score.n_samples} samples per problem; the study asks for "
                            f"{expected.n_samples}: rerun it")
    if not samples:
        return
    rows = read_samples(path)  # missing, cut, edited: DamagedScores naming it
    problems = len({str(r.get("problem_id")) for r in rows})
    if problems != score.problems or (score.n_samples and len(rows) != problems * score.n_samples):
        raise DamagedScores(f"{path}: {len(rows)} samples of {problems} problems; its summary says "
                            f"{score.problems} problems x {score.n_samples}: rerun the evaluation")


def _percent(s: dict, key: str, path: Path) -> float:
    """A score of the summary: a finite number in [0, 100]."""
    value = float(s[key]) if not isinstance(s[key], (list, dict, bool)) else math.nan
    if not (math.isfinite(value) and 0 <= value <= 100):
        raise DamagedScores(f"{path}: {key} is {s[key]!r}, not a percentage in [0, 100]: rerun the evaluation")
    return value


def _read_summary(path: Path, model: str, method: str, ckpt: str, benchmark: str) -> Score:
    setting = path.name[: -len(".summary.json")]
    try:
        s = bounded.load_json(path, what="a score summary")
        rule = _percent(s, "avg_at_n", path)
        corrected = s.get("avg_at_n_corrected")
        acc = rule if corrected is None else _percent(s, "avg_at_n_corrected", path)  # the paper's: corrected
        ci = (s.get("ci95") if corrected is None else s.get("ci95_corrected")) or (acc, acc)
        lo, hi = (_percent({"ci95": v}, "ci95", path) for v in ci)
    except (ValueError, KeyError, TypeError, AttributeError, OSError) as e:
        if isinstance(e, (DamagedScores, bounded.BadFile)):  # each names the file already
            raise DamagedScores(str(e)) from None
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


def _across_seeds(scores_dir, per_seed: dict[tuple, dict[int, Score]], expected: dict[str, Expected]
                  ) -> list[Score]:
    """One Score per several-seed cell: accuracy = mean over seeds and problems of the per-sample verdicts, CI
    from the two-stage bootstrap (stapo.report.seed_statistics); rates: the seeds' mean. Every seed with a summary
    (and every seed the study runs) must have its per-sample file: a missing one is named, never averaged over."""
    if not per_seed:
        return []
    cells = seeds.seed_cells(scores_dir)
    out = []
    for key, by_seed in per_seed.items():
        samples, group = cells.get(key), list(by_seed.values())
        wanted = set(by_seed) | set(getattr(expected.get(key[3]), "seeds", None) or ())
        missing = sorted(wanted - set(samples.seeds if samples else ()))
        if missing:
            where = Path(scores_dir, key[0], key[1], f"seed{missing[0]}", key[2], key[3], f"{key[4]}.jsonl")
            raise DamagedScores(f"{where}: missing ({len(missing)} of the cell's {len(wanted)} seeds); a several-"
                                "seed cell is never averaged over the seeds that are left: rerun its evaluation")
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
        who = in_use(path.parent / RUN_LOCK)
        if who:
            raise StillRunning(f"{path.parent}: still being trained ({who}); report once it has finished")
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
            config = bounded.load_yaml(path, limits.MAX_JSON_BYTES, "a run's config.yaml") or {}
        except (OSError, ValueError):
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
