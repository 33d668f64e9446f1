"""Scores of one evaluation: per-sample records and the summary (avg@N with a bootstrap CI, pass@k, maj@N, rates).

Pure functions of the graded samples (numpy); ``stapo eval`` writes what they return (README "How scores are
computed"). Every accuracy is in %.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from math import comb
from pathlib import Path

import numpy as np

from stapo.tasks.answers import normalize_answer
from stapo.tasks.problems import EvalProtocol
from stapo.core import bounded, limits
from stapo.core.errors import UserError
from stapo.core.jsonl import JsonlError, read_jsonl
from stapo.study.evaluation import EvalConfig

__all__ = ["build_records", "avg_at_n", "pass_at_k", "maj_at_n", "bootstrap_ci", "summarize", "BOOTSTRAP_ITERS",
           "DamagedScores", "read_samples", "samples_file_digest"]

BOOTSTRAP_ITERS = 10_000


def build_records(problems: list[dict], grades: list, n_tokens: list[int], max_new_tokens: int,
                  protocol: EvalProtocol) -> list[dict]:
    """Per-sample records: the protocol's rule verdict (reported), both rule stages' verdicts, the fallback
    diagnostic, length and truncation.

    ``correct`` and ``gold`` are the protocol's (``justrl``: JustRL's verdict and gold string, what its verifier
    re-judges; ``harness``: the strict final box by math-verify against the clean gold); ``correct_harness`` and
    ``correct_justrl`` are both rule stages' verdicts whatever the protocol (``correct_justrl`` None if the grades
    have none), so a report can count the samples the choice moves. ``extracted`` and ``status`` are the strict
    final box's (the no-box, unparsable and timeout counts).

    ``truncated``: the completion's re-tokenised length reaches ``max_new_tokens`` (it did not stop at an
    end-of-turn token). lm-eval returns text only, so the length is re-counted from the text; decode then encode
    is not always the identity (a random 8-token completion re-encodes to 8-10 tokens), so ``tokens`` is
    approximate, and a completion that ended at an end-of-turn token one or two tokens short of the cap can be
    counted as truncated.
    """
    records, it = [], iter(zip(grades, n_tokens, strict=True))
    for p in problems:
        for k, text in enumerate(p["completions"]):
            g, tokens = next(it)
            justrl = protocol.justrl_rule_stage
            records.append({"problem_id": p["problem_id"], "sample": k, "completion": text, "extracted": g.extracted,
                            "gold": p.get("gold_justrl") or p["gold"] if justrl else p["gold"],
                            "correct": bool(g.justrl_correct) if justrl else g.correct, "status": g.status,
                            "correct_harness": g.correct, "correct_justrl": g.justrl_correct,
                            "status_justrl": g.justrl_status,
                            "correct_fallback": g.fallback_correct, "extracted_fallback": g.fallback_extracted,
                            "tokens": tokens, "truncated": tokens >= max_new_tokens})
    return records


def avg_at_n(correct: np.ndarray) -> float:
    """avg@N (%): mean accuracy over problems x samples; ``correct`` is bool [problems, N]."""
    return float(np.mean(correct) * 100) if correct.size else 0.0


def pass_at_k(correct: np.ndarray, k: int) -> float:
    """Unbiased pass@k (%) (Chen et al. 2021): mean over problems of 1 - C(n-c, k) / C(n, k)."""
    n = correct.shape[1]
    if not 1 <= k <= n:
        raise ValueError(f"pass@k: k={k} must be in 1..{n}")
    vals = [1.0 - comb(n - int(c), k) / comb(n, k) for c in correct.sum(axis=1)]
    return float(np.mean(vals) * 100) if vals else 0.0


def maj_at_n(extracted: list[list[str | None]], correct: np.ndarray) -> float:
    """maj@N (%): the most frequent extracted answer (normalised; ties -> first seen) is graded per problem."""
    hits = []
    for answers, row in zip(extracted, correct):
        keys = [normalize_answer(a) if a is not None else None for a in answers]
        votes = Counter(k for k in keys if k is not None)
        if not votes:
            hits.append(False)
            continue
        top = max(votes.values())
        winner = next(k for k in keys if k is not None and votes[k] == top)
        hits.append(bool(row[keys.index(winner)]))
    return float(np.mean(hits) * 100) if hits else 0.0


def bootstrap_ci(correct: np.ndarray, iters: int = BOOTSTRAP_ITERS, seed: int = 0) -> list[float]:
    """95 % percentile bootstrap CI (%) of avg@N, resampling problems with replacement."""
    if correct.shape[0] == 0:
        return [0.0, 0.0]
    per_problem = correct.mean(axis=1)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(per_problem), size=(iters, len(per_problem)))
    means = per_problem[idx].mean(axis=1) * 100
    return [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]


def _matrix(groups: list[list[dict]], key: str, n: int) -> np.ndarray:
    return np.array([[bool(r[key]) for r in g] for g in groups], dtype=bool).reshape(len(groups), n)


def _rate(count: int, total: int) -> float:
    return 100.0 * count / total if total else 0.0


def summarize(records: list[dict], cfg: EvalConfig, model: str, verifier: dict | None = None) -> dict:
    """FILE.summary.json from the per-sample records (grouped by problem, in order).

    ``avg_at_n`` is the protocol's rule verdict (``EvalProtocol.rule_stage``); ``avg_at_n_harness`` /
    ``avg_at_n_justrl`` each rule stage's, and ``rule_moved`` the samples on which they differ;
    ``avg_at_n_fallback`` the lenient diagnostic;
    ``avg_at_n_corrected`` (with a verifier; None without) the rule verdict corrected by the LLM verifier, which is
    what the paper reports. Rates are % of samples.
    """
    import lm_eval

    by_problem: dict[str, list[dict]] = {}
    for r in records:
        by_problem.setdefault(r["problem_id"], []).append(r)
    groups = [sorted(v, key=lambda r: r["sample"]) for v in by_problem.values()]
    correct = _matrix(groups, "correct", cfg.n)
    status = Counter(r["status"] for r in records)
    truncated = sum(bool(r.get("truncated")) for r in records)
    corrected = _matrix(groups, "correct_verified", cfg.n) if verifier else None
    both = groups and all(r.get("correct_justrl") is not None for r in records)
    return {
        "benchmark": cfg.benchmark, "setting": cfg.setting, "model": model,
        "avg_at_n": avg_at_n(correct), "ci95": bootstrap_ci(correct),
        "pass_at_k": {"1": pass_at_k(correct, 1), str(cfg.n): pass_at_k(correct, cfg.n)} if groups else {},
        "maj_at_n": maj_at_n([[r["extracted"] for r in g] for g in groups], correct),
        "n_samples": cfg.n, "problems": len(groups), "samples": len(records),
        "timeouts": status["timeout"], "unparsable": status["unparsable"],
        "no_box": status["no_box"], "no_box_rate": _rate(status["no_box"], len(records)),
        "truncated": truncated, "truncation_rate": _rate(truncated, len(records)),
        "avg_at_n_fallback": avg_at_n(_matrix(groups, "correct_fallback", cfg.n)) if groups else 0.0,
        "avg_at_n_corrected": avg_at_n(corrected) if corrected is not None else None,
        "ci95_corrected": bootstrap_ci(corrected) if corrected is not None else None,
        "verifier": verifier,
        "rule_stage": cfg.protocol,
        "avg_at_n_harness": avg_at_n(_matrix(groups, "correct_harness", cfg.n)) if both else None,
        "avg_at_n_justrl": avg_at_n(_matrix(groups, "correct_justrl", cfg.n)) if both else None,
        "rule_moved": sum(r["correct_harness"] != r["correct_justrl"] for r in records) if both else None,
        "grading": f"{cfg.protocol.rule_stage}; the other rule stage, fallback and verifier-corrected alongside",
        "generation": {"temperature": cfg.temperature, "top_p": cfg.top_p, "max_new_tokens": cfg.max_new_tokens,
                       "n": cfg.n, "backend": cfg.backend, "seed": cfg.seed, "limit": cfg.limit,
                       "data_dir": cfg.data_dir, "stop": list(cfg.stop), "protocol": cfg.protocol,
                       "worked_example": cfg.worked_example},
        "lm_eval_version": lm_eval.__version__,
    }


# ------------------------------------------------------------------------------------ the per-sample file


class DamagedScores(UserError, ValueError):
    """A per-sample file that does not match its summary, or a summary that is not one: one line naming the file."""


def samples_file_digest(data: bytes) -> dict:
    """What the summary records of its per-sample file (``samples_file``): lines and SHA-256 of the exact bytes."""
    return {"lines": data.count(b"\n"), "sha256": hashlib.sha256(data).hexdigest()}


def summary_of(samples: Path) -> Path:
    return samples.with_name(samples.name.removesuffix(".jsonl") + ".summary.json")


def read_samples(path: str | Path) -> list[dict]:
    """The records of a per-sample file, checked against its summary before any is used: the SHA-256 and line
    count the summary recorded (``samples_file``; a summary written before it: the count of ``samples``). A file
    cut short, a line cut mid-way or a missing summary is a DamagedScores naming the file."""
    path = Path(path)
    summary_path, fix = summary_of(path), "rerun its evaluation (delete it and its summary)"
    try:
        data = bounded.read_bytes(path, limits.MAX_SAMPLES_BYTES, "a per-sample file")
        summary = bounded.load_json(summary_path, what="a score summary")
    except FileNotFoundError as err:
        raise DamagedScores(f"{err.filename}: missing (an evaluation writes {path.name} and its summary); {fix}"
                            ) from None
    except bounded.BadFile as err:
        raise DamagedScores(f"{err}; {fix}") from None
    except OSError as err:
        raise DamagedScores(f"{summary_path}: not a readable score summary ({err.strerror}); {fix}") from None
    recorded = summary.get("samples_file") if isinstance(summary, dict) else None
    if recorded and samples_file_digest(data) != recorded:
        got = samples_file_digest(data)
        raise DamagedScores(f"{path}: {got['lines']} lines, SHA-256 {got['sha256'][:12]}…; its summary recorded "
                            f"{recorded['lines']} lines, {recorded['sha256'][:12]}…: the file was changed or cut "
                            f"after the evaluation; {fix}")
    try:  # stapo.core.jsonl's policy: written whole (atomically), so a torn last line is damage, not a kill artefact
        records = read_jsonl(path, data=data)
    except JsonlError as err:
        raise DamagedScores(f"{err.where}: not a JSON record (cut mid-way?): {err.reason}; {fix}") from None
    expected = summary.get("samples") if isinstance(summary, dict) else None
    if expected is not None and len(records) != expected:
        raise DamagedScores(f"{path}: {len(records)} samples, its summary says {expected}; {fix}")
    return records
