"""Score cells as ``stapo eval`` writes them: a summary and the per-sample file it describes (with its digest),
which is what ``stapo report`` verifies before it prints a number (stapo.report.results.load_scores)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from stapo.core.atomic import atomic_write, atomic_write_json
from stapo.eval.scoring import samples_file_digest


def write_cell(summary_path: Path, summary: dict) -> dict:
    """Write ``summary`` (problems default 30, n_samples 4) and its per-sample file: problems x n_samples records,
    as many of them correct as the summary's avg_at_n allows on that grid. Returns the summary written."""
    summary = dict(summary)
    problems, n = summary.setdefault("problems", 30), summary.setdefault("n_samples", 4)
    acc = summary.get("avg_at_n")
    acc = acc if isinstance(acc, (int, float)) and math.isfinite(acc) else 0.0
    hits = round(min(max(acc, 0.0), 100.0) / 100 * problems * n)
    rows = [{"problem_id": f"p{p:03d}", "sample": k, "correct": p * n + k < hits}
            for p in range(problems) for k in range(n)]
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    atomic_write(Path(summary_path).with_name(Path(summary_path).name.removesuffix(".summary.json") + ".jsonl"), data)
    summary.update(samples=len(rows), samples_file=samples_file_digest(data))
    atomic_write_json(summary_path, summary)
    return summary
