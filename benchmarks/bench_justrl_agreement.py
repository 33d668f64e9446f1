"""The ``justrl`` rule stage against JustRL's own grader, and JustRL's golds byte for byte.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_justrl_agreement.py --justrl DIR
        [--json OUT.json] [--write-fixture tests/data/justrl_verdicts.jsonl] [--per-form 24]

DIR is a checkout of thunlp/JustRL, or its git directory (files are read with ``git show HEAD:...``): its
``evals/utils.py`` is imported as the peer (it needs sympy and pylatexenc, as stapo.tasks.justrl_grading does) and its
``data/*/test.parquet`` give the golds. Nothing of JustRL is copied into the package; this script is run by hand
(tests run offline and pin its verdicts instead: tests/test_justrl_grading.py).

1. Golds: ``answer_justrl`` of every shipped benchmark row (stapo.tasks.load_rows) against JustRL's
   ``reward_model.ground_truth.strip()`` (evals/gen_vllm.py ``load_samples``); target 1,546 / 1,546.
2. Agreement: a corpus built from the shipped benchmarks' answers (no worked solutions are shipped), each written
   the ways models write answers (``FORMS``: ``\\text{}``, units, degrees, percent, ``$``, thousands separators,
   intervals, several boxes, a truncated box, ...), inside a little reasoning text, each graded against JustRL's
   gold by ``stapo.tasks.justrl_grading.grade_answer_verl`` and JustRL's ``grade_answer_verl``; counts per form. A pair
   whose grading runs past ``--pair-timeout`` s in either is counted apart (JustRL's bare ``except:`` could
   swallow the alarm, so elapsed time decides). Target: 0 disagreements.
``--write-fixture`` writes a stratified sample (``--per-form`` pairs of each form, every disagreement and both
verdicts of each form where they occur) with JustRL's verdicts, which the tests pin.

Figures (2026-12-05, thunlp/JustRL @ cf444e9, sympy 1.14.0, pylatexenc 2.10, one process on a shared 2-core machine):
    golds byte-equal to JustRL's: 1,546 / 1,546 (AIME24 30/30 boxed, OlympiadBench 674/674 with the 265 ``$...$``).
    34,408 pairs graded by both in 35 s: 34,408 agree, 0 disagree, 0 timeouts (pair timeout 30 s); per form
    (pairs, of which JustRL correct): plain 1546 (1545), text 1546 (1545), units_text_space 1546 (1545), units_word
    1546 (1545), degrees 1546 (1545), degrees_braced 1546 (1272), percent 1546 (1545), dollar_sign 1546 (1545),
    inline_math 1546 (1545), thousands 96 (96), decimal 840 (840), dfrac 252 (252), interval_spacing 56 (56),
    equation 1546 (1256), boxes_last_is_gold 1546 (1545), boxes_first_is_gold 1546 (5), plus_zero 1546 (385),
    times_one 1546 (384), negated 1546 (1), slash_fraction 207 (206), perturbed_digit 1521 (13), upper_case 516
    (137), spaced_out 1546 (1179), truncated_box 1546 (0), fbox 1546 (0), no_box 1546 (0), wrong 1546 (5).
    Both run in one Python with one sympy, so a verdict that differs between sympy 1.13.1 (JustRL's pin) and the
    installed one is not measured here.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import io
import json
import random
import re
import signal
import subprocess
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stapo.tasks import justrl_grading  # noqa: E402
from stapo.tasks import load_rows  # noqa: E402

BENCHMARKS = {"aime24": "AIME24", "aime25": "AIME25", "amc23": "AMC23", "math500": "MATH-500", "minerva": "Minerva",
              "olympiadbench": "Olympiad-Bench"}
REASONING = "Let me work through the problem step by step.\nAfter simplifying, we get the result.\n"


def _integer(a: str) -> bool:
    return re.fullmatch(r"-?\d+", a) is not None


def _slash(a: str) -> str:
    """``\\frac{p}{q}`` -> ``p/q`` (simple numerators and denominators)."""
    return re.sub(r"\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}", r"\1/\2", a)


def _perturb(a: str) -> str:
    """The answer with its last digit changed (a near miss)."""
    digits = [m.start() for m in re.finditer(r"\d", a)]
    if not digits:
        return a
    k = digits[-1]
    return a[:k] + str((int(a[k]) + 1) % 10) + a[k + 1:]


# form -> f(answer, another problem's answer) -> the completion, or None where the form does not apply
FORMS = {
    "plain": lambda a, o: f"{REASONING}The answer is $\\boxed{{{a}}}$.",
    "text": lambda a, o: f"{REASONING}So the answer is \\boxed{{\\text{{{a}}}}}.",
    "units_text_space": lambda a, o: f"{REASONING}\\boxed{{{a} \\text{{ cm}}}}",
    "units_word": lambda a, o: f"{REASONING}\\boxed{{{a}\\text{{ meters}}}}",
    "degrees": lambda a, o: f"{REASONING}\\boxed{{{a}^\\circ}}",
    "degrees_braced": lambda a, o: f"{REASONING}\\boxed{{{a}^{{\\circ}}}}",
    "percent": lambda a, o: f"{REASONING}\\boxed{{{a}\\%}}",
    "dollar_sign": lambda a, o: f"{REASONING}\\boxed{{\\${a}}}",
    "inline_math": lambda a, o: f"{REASONING}\\boxed{{${a}$}}",
    "thousands": lambda a, o: f"{REASONING}\\boxed{{{int(a):,}}}" if _integer(a) and abs(int(a)) >= 1000 else None,
    "decimal": lambda a, o: f"{REASONING}\\boxed{{{a}.0}}" if _integer(a) else None,
    "dfrac": lambda a, o: f"{REASONING}\\boxed{{{a.replace(chr(92) + 'frac', chr(92) + 'dfrac')}}}"
    if "\\frac" in a else None,
    "interval_spacing": lambda a, o: f"{REASONING}\\boxed{{\\left{a[0]} {a[1:-1].replace(',', ', ')} \\right{a[-1]}}}"
    if a[:1] in "([" and a[-1:] in ")]" and len(a) > 2 else None,
    "equation": lambda a, o: f"{REASONING}\\boxed{{x = {a}}}",
    "boxes_last_is_gold": lambda a, o: f"{REASONING}First guess \\boxed{{{o}}}; checking again, \\boxed{{{a}}}.",
    "boxes_first_is_gold": lambda a, o: f"{REASONING}First guess \\boxed{{{a}}}; on reflection, \\boxed{{{o}}}.",
    "plus_zero": lambda a, o: f"{REASONING}\\boxed{{{a} + 0}}",  # sympy decides (not for integer golds)
    "times_one": lambda a, o: f"{REASONING}\\boxed{{1 \\times {a}}}",
    "negated": lambda a, o: f"{REASONING}\\boxed{{-({a})}}",
    "slash_fraction": lambda a, o: f"{REASONING}\\boxed{{{_slash(a)}}}" if _slash(a) != a else None,
    "perturbed_digit": lambda a, o: f"{REASONING}\\boxed{{{_perturb(a)}}}" if _perturb(a) != a else None,
    "upper_case": lambda a, o: f"{REASONING}\\boxed{{{a.upper()}}}" if a.upper() != a else None,
    "spaced_out": lambda a, o: f"{REASONING}\\boxed{{{' '.join(a)}}}",
    "truncated_box": lambda a, o: f"{REASONING}The answer is \\boxed{{{a}",
    "fbox": lambda a, o: f"{REASONING}\\fbox{{{a}}}",
    "no_box": lambda a, o: f"{REASONING}The answer is {a}.",
    "wrong": lambda a, o: f"{REASONING}\\boxed{{{o}}}",
}


# ------------------------------------------------------------------------------------------------- JustRL


def _justrl_file(root: Path, path: str) -> bytes:
    if (root / path).is_file():
        return (root / path).read_bytes()
    return subprocess.run(["git", f"--git-dir={root}", "show", f"HEAD:{path}"], check=True,
                          capture_output=True).stdout


def load_peer(root: Path):
    """JustRL's evals/utils.py as a module (its invalid-escape warnings silenced)."""
    work = Path("/tmp") / f"justrl-peer-{hashlib.sha1(str(root).encode()).hexdigest()[:8]}"
    work.mkdir(exist_ok=True)
    (work / "justrl_utils.py").write_bytes(_justrl_file(root, "evals/utils.py"))
    spec = importlib.util.spec_from_file_location("justrl_utils", work / "justrl_utils.py")
    module = importlib.util.module_from_spec(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec.loader.exec_module(module)
    return module


def justrl_golds(root: Path, benchmark: str) -> list[str]:
    """JustRL's gold strings of a benchmark, as evals/gen_vllm.py ``load_samples`` hands them to grade.py."""
    import pandas as pd

    df = pd.read_parquet(io.BytesIO(_justrl_file(root, f"data/{BENCHMARKS[benchmark]}/test.parquet")))
    return [df.at[i, "reward_model"]["ground_truth"].strip() for i in range(len(df))]


def gold_digest(golds: list[str]) -> str:
    """sha256 of the golds joined by NUL (what tests/data/justrl_golds.json pins)."""
    return hashlib.sha256("\x00".join(golds).encode("utf-8")).hexdigest()


# ------------------------------------------------------------------------------------------------- grading


class _Alarm(BaseException):
    pass


def _timed(fn, completion: str, gold: str, seconds: float) -> tuple[bool | None, float]:
    """(verdict, seconds); verdict None when it ran past ``seconds``."""
    def expire(signum, frame):
        raise _Alarm

    signal.signal(signal.SIGALRM, expire)
    start = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        verdict = bool(fn(completion, gold))
    except _Alarm:
        verdict = None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    elapsed = time.monotonic() - start
    return (None if elapsed >= seconds else verdict), elapsed


def build_corpus(seed: int = 0) -> list[dict]:
    """Every applicable (form, benchmark row) pair: the completion and JustRL's gold (``answer_justrl``)."""
    corpus = []
    for benchmark in BENCHMARKS:
        rows = load_rows(benchmark)
        rng = random.Random(f"{seed}-{benchmark}")
        for i, row in enumerate(rows):
            other = rows[(i + 1 + rng.randrange(len(rows) - 1)) % len(rows)]["answer"]
            for form, make in FORMS.items():
                completion = make(row["answer"], other)
                if completion is not None:
                    corpus.append({"form": form, "id": row["id"], "completion": completion,
                                   "gold": row["answer_justrl"]})
    return corpus


def grade_corpus(corpus: list[dict], peer, seconds: float) -> None:
    """Adds ``justrl`` (the peer's verdict), ``ours`` and their seconds to each pair, in place."""
    for k, pair in enumerate(corpus):
        pair["justrl"], pair["justrl_s"] = _timed(peer.grade_answer_verl, pair["completion"], pair["gold"], seconds)
        pair["ours"], pair["ours_s"] = _timed(justrl_grading.grade_answer_verl, pair["completion"], pair["gold"],
                                              seconds)
        if k % 2000 == 0:
            print(f"  {k}/{len(corpus)} graded", file=sys.stderr, flush=True)


def per_form(corpus: list[dict]) -> dict:
    table = {}
    for form in FORMS:
        pairs = [p for p in corpus if p["form"] == form]
        timed_out = [p for p in pairs if p["justrl"] is None or p["ours"] is None]
        done = [p for p in pairs if p not in timed_out]
        table[form] = {"pairs": len(pairs), "agree": sum(p["justrl"] == p["ours"] for p in done),
                       "disagree": sum(p["justrl"] != p["ours"] for p in done), "timeout": len(timed_out),
                       "justrl_correct": sum(bool(p["justrl"]) for p in done)}
    return table


def fixture(corpus: list[dict], per: int, seed: int = 0) -> list[dict]:
    """Up to ``per`` pairs of each form, both verdicts where they occur, every disagreement; no timeouts."""
    rng = random.Random(seed)
    keep = []
    for form in FORMS:
        pairs = [p for p in corpus if p["form"] == form and p["justrl"] is not None and p["ours"] is not None]
        chosen = [p for p in pairs if p["justrl"] != p["ours"]]
        for verdict in (True, False):
            same = [p for p in pairs if p["justrl"] is verdict and p not in chosen]
            chosen += rng.sample(same, min(len(same), per // 2))
        keep += sorted(chosen, key=lambda p: p["id"])
    return [{"form": p["form"], "id": p["id"], "completion": p["completion"], "gold": p["gold"],
             "justrl": p["justrl"]} for p in keep]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--justrl", type=Path, required=True, help="thunlp/JustRL checkout or git directory")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--write-fixture", type=Path)
    parser.add_argument("--per-form", type=int, default=24)
    parser.add_argument("--pair-timeout", type=float, default=30.0)
    args = parser.parse_args()
    peer = load_peer(args.justrl)
    golds = {}
    for benchmark in BENCHMARKS:
        theirs, ours = justrl_golds(args.justrl, benchmark), [r["answer_justrl"] for r in load_rows(benchmark)]
        golds[benchmark] = {"rows": len(theirs), "equal": sum(a == b for a, b in zip(theirs, ours)),
                            "same_rows": len(theirs) == len(ours), "sha256": gold_digest(theirs)}
    total = sum(g["rows"] for g in golds.values())
    print(f"golds byte-equal to JustRL's: {sum(g['equal'] for g in golds.values())} / {total}")
    corpus = build_corpus()
    start = time.monotonic()
    grade_corpus(corpus, peer, args.pair_timeout)
    table = per_form(corpus)
    print(f"{len(corpus)} pairs graded by both in {time.monotonic() - start:.0f} s "
          f"(JustRL {sum(p['justrl_s'] for p in corpus):.0f} s, ours {sum(p['ours_s'] for p in corpus):.0f} s; "
          f"slowest pair JustRL {max(p['justrl_s'] for p in corpus):.2f} s, "
          f"ours {max(p['ours_s'] for p in corpus):.2f} s)")
    print(f"{'form':<22}{'pairs':>7}{'agree':>7}{'disagree':>9}{'timeout':>8}{'correct':>8}")
    for form, row in table.items():
        print(f"{form:<22}{row['pairs']:>7}{row['agree']:>7}{row['disagree']:>9}{row['timeout']:>8}"
              f"{row['justrl_correct']:>8}")
    totals = Counter()
    for row in table.values():
        totals.update(row)
    print(f"{'total':<22}{totals['pairs']:>7}{totals['agree']:>7}{totals['disagree']:>9}{totals['timeout']:>8}"
          f"{totals['justrl_correct']:>8}")
    for p in [p for p in corpus if p["justrl"] is not None and p["ours"] is not None and p["justrl"] != p["ours"]][:20]:
        print("DISAGREE", p["form"], p["id"], repr(p["completion"][len(REASONING):]), repr(p["gold"]),
              "justrl", p["justrl"], "ours", p["ours"])
    if args.write_fixture:
        rows = fixture(corpus, args.per_form)
        args.write_fixture.parent.mkdir(parents=True, exist_ok=True)
        args.write_fixture.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        (args.write_fixture.parent / "justrl_golds.json").write_text(json.dumps(golds, indent=1) + "\n")
        print(f"wrote {len(rows)} pinned verdicts to {args.write_fixture}")
    if args.json:
        args.json.write_text(json.dumps({"golds": golds, "forms": table, "pairs": len(corpus)}, indent=1))
    return 0 if totals["disagree"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
