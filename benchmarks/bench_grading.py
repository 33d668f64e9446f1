"""Benchmark of stapo.tasks.grading.grade: throughput against sequential math-verify, and the adversarial batch.

    .venv/bin/python benchmarks/bench_grading.py [--data-dir stapo/tasks/data] [--pairs 2000]
                                                 [--workers N] [--timeout 5] [--json OUT.json] [--justrl]

1. 2,000 (completion, gold) pairs built from the golds of the six benchmark files: a third correct (gold boxed
   verbatim), a third reformatted (\\dfrac, trailing ".0", spacing, \\left( \\right), degrees), a third wrong
   (perturbed gold). Each completion has ~600 characters of reasoning before the box. Timed, each pass in a fresh
   process (cold caches alike): ``grade()`` (process pool, its start-up included) vs the same work sequentially in
   one process (``grade_one`` in the main thread), rounds alternating the order; CPU seconds are recorded too, since
   on a shared machine free cores, not the code, bound the wall-clock speed-up. Plain math-verify defaults
   (``parse`` + ``verify``) for reference.
   grade() grades identical (final box, gold) pairs once; these 2,000 pairs hold 1,382 distinct ones (golds repeat,
   as avg@N's samples of one problem do), so the same passes are also timed on the distinct pairs alone: that
   speed-up is the process pool's, without the deduplication.
   Target: >= 1.8x speed-up on 2 cores.
``--justrl``: both rule stages, as ``stapo eval`` grades (``grade(justrl_golds=...)`` with JustRL's golds: the rows'
``answer_raw`` else ``answer``), and 10 more adversarial completions aimed at JustRL's sympy stage (``9**9**99``
against a non-integer gold); the adversarial budget doubles, each stage having its own deadline.
2. 50 distinct adversarial completions (1 MB of text, ``9^{9^{9^{9}}}``, 500-deep nested braces, ``__import__('os')...``
   payloads). Target: done within 50 x timeout / workers + 10 s, and /tmp/pwned never created.

Figures (2026-12-02, 2 CPU cores shared with two other sessions, load average ~4.8, kernel autogroup scheduling
on, i.e. this session's processes together get about one session's share, ~0.65 core, however many they are):
    grade() 25.5 answers/s vs sequential grade_one 34.9 answers/s (speed-up 0.73x: NOT the 1.8x target), while
    grade() used 55 CPU s for 4,000 answers vs 79 CPU s sequentially (no CPU overhead from the pool; the wall-clock
    speed-up needs free cores, which this machine did not have). Plain math-verify defaults: 27.1 answers/s.
    Adversarial: 50 completions in 57 s (budget 50 x 5 / 2 + 10 = 135 s): 25 ok, 20 timeout, 5 unparsable,
    0 error; none graded correct except the 1 MB text whose box holds the gold; /tmp/pwned never created.
Re-measured the same day on a quiet machine (load average 0.6 at start, 1.7 at the end):
    grade() 76.3 answers/s vs sequential grade_one 50.7 answers/s: speed-up 1.50x (target 1.8x NOT met); vs
    plain math-verify defaults (41.9 answers/s) 1.82x. CPU: 46.9 s pooled vs 78.4 s sequential for 4,000 answers.
    Adversarial: 52.7 s (budget 135 s), 25 ok / 20 timeout / 5 unparsable / 0 error; /tmp/pwned never created.
    Where the 0.4x went: two pairs of the 2,000 time out (a Minerva equation whose sympy comparison runs for
    minutes); the parent killed both workers at the deadline, and the replacements started with cold ANTLR / sympy
    caches; and round-robin dispatch made both workers parse nearly every gold (~13 ms each, most of the work).
After the fixes (deadline enforced inside the worker by SIGALRM, parent kill only HARD_GRACE later for workers
stuck in C; all answers to one gold dispatched to one worker), quiet machine (load average 0.9 -> 1.7):
    grade() 87.6 answers/s vs sequential grade_one 46.1 answers/s: speed-up 1.90x (target met); vs plain
    math-verify defaults (42.8 answers/s) 2.05x. CPU: 86.2 s pooled vs 86.3 s sequential (the pool adds none).
    Adversarial: 51.4 s (budget 135 s), 25 ok / 20 timeout / 5 unparsable / 0 error; /tmp/pwned never created.
After the strict final-box grading (issue 11: every answer gets the strict and the fallback verdict in one pass)
and the shipped benchmark files, quiet machine (load average ~1.6), two runs of the default command:
    grade() 139.6 / 139.4 answers/s vs sequential grade_one 84.7 / 82.7 answers/s: speed-up 1.65x / 1.69x
    (target 1.8x NOT met); vs plain math-verify defaults (79.2 / 66.1 answers/s) 1.76x / 2.11x. Both paths got
    faster (sequential 46 -> 84 answers/s), so the pool's fixed per-call cost weighs more. CPU: 51.6 s pooled vs
    47.2 s sequential. Adversarial: 50.5 s (budget 135 s), 27 ok / 18 timeout / 5 unparsable / 0 error.
After grade() grades identical (box, gold) pairs once (2026-12-03, quiet machine, load average 0.0 at start):
    grade() 186.0 answers/s vs sequential grade_one 80.7 answers/s: speed-up 2.31x (target met); vs plain
    math-verify defaults (73.1 answers/s) 2.55x. CPU: 40.9 s pooled vs 49.3 s sequential. The pool alone, on the
    1,382 distinct pairs: speed-up 1.64x (CPU 40.2 s pooled vs 34.8 s sequential: each worker warms its own
    parser caches); the rest of the 2.31x is the deduplication. Adversarial (now 50 distinct completions):
    46.5 s (budget 135 s), 34 ok / 16 timeout / 0 unparsable / 0 error; /tmp/pwned never created.
JustRL's rule stage added (issue 31; 2026-12-05, 2 cores shared with two other sessions, load average 5.6-6.9, so
wall-clock figures are the machine's; CPU seconds are the code's). Three runs back to back, default command:
    before (e15f9e0):      grade() 76.1 answers/s, 31.0 CPU s for 4,000 answers; adversarial 50.0 s (budget 135 s),
                           33 ok / 17 timeout; /tmp/pwned never created.
    after, harness alone:  grade() 70.6 answers/s (load 6.9 vs 5.6), 30.9 CPU s: unchanged; adversarial 51.4 s,
                           33 ok / 17 timeout.
    after, --justrl (what stapo eval now runs): grade() 62.9 answers/s, 34.1 CPU s (+10 % for the second stage);
                           adversarial 60 completions in 72.5 s (budget 310 s): harness 42 ok / 18 timeout, JustRL
                           40 ok / 10 no_box / 10 timeout (the ten ``**`` towers) / 0 error; JustRL's verdict is
                           "correct" on the 500-deep braces around the gold 1 (its normalisation drops braces);
                           /tmp/pwned never created.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

PWNED = Path("/tmp/pwned")
FILES = ["aime24", "aime25", "amc23", "math500", "minerva_math", "olympiadbench"]
FILLER = ("Let us reason step by step. First we set up the equation from the statement and simplify both sides; "
          "then we check the boundary cases, and verify the result by substituting it back. ") * 3


def load_golds(data_dir: Path) -> list[tuple[str, str]]:
    """(the clean gold, JustRL's gold: ``answer_raw`` else ``answer``) of every row."""
    golds = []
    for name in FILES:
        with open(data_dir / f"{name}.jsonl", encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        golds += [(r["answer"], r.get("answer_raw") or r["answer"]) for r in rows]
    return golds


def reformat(gold: str, rng: random.Random) -> str:
    """An equivalent spelling of ``gold`` (falls back to extra spaces)."""
    if gold.isdigit():
        return rng.choice([f"{gold}.0", f"{gold}.00", f" {gold} "])
    if "\\frac" in gold:
        return gold.replace("\\frac", "\\dfrac")
    if gold.startswith("(") and gold.endswith(")"):
        return "\\left" + gold[:-1] + "\\right)"
    if gold.endswith("^\\circ"):
        return gold[: -len("^\\circ")]
    return " ".join(gold)


def perturb(gold: str, rng: random.Random) -> str:
    """A (very likely) wrong answer near ``gold``."""
    if gold.isdigit():
        return str(int(gold) + rng.randint(1, 9))
    if "\\frac" in gold:
        return gold.replace("\\frac", "\\frac{2}", 1) if rng.random() < 0.5 else "-(" + gold + ")"
    return gold + "+1"


def make_pairs(golds: list[tuple[str, str]], n: int, seed: int = 0) -> tuple[list[str], list[str], list[str]]:
    """(completions, their clean golds, their JustRL golds)."""
    rng = random.Random(seed)
    completions, answers, justrl_answers = [], [], []
    for i in range(n):
        gold, justrl_gold = rng.choice(golds)
        answer = [gold, reformat(gold, rng), perturb(gold, rng)][i % 3]
        completions.append(f"{FILLER}Therefore the final answer is $\\boxed{{{answer}}}$.")
        answers.append(gold)
        justrl_answers.append(justrl_gold)
    return completions, answers, justrl_answers


def adversarial(n: int = 50) -> tuple[list[str], list[str]]:
    """``n`` distinct hostile completions (10 kinds, each varied by its index so that no two are graded as one)."""
    def payload(i: int) -> str:
        return f"__import__('os').system('touch /tmp/pwned') or {i}"

    kinds = [
        lambda i: "x" * 1_000_000 + f"\\boxed{{{i % 7}}}",
        lambda i: f"\\boxed{{9^{{9^{{9^{{{9 + i}}}}}}}}}",
        lambda i: "\\boxed{" + "{" * (500 + i) + "1" + "}" * (500 + i) + "}",
        lambda i: f"\\boxed{{{payload(i)}}}",
        lambda i: f"The answer is ${payload(i)}$",
        lambda i: payload(i),
        lambda i: "\\boxed{" + "9^{" * (50 + i) + "9" + "}" * (50 + i) + "}",
        lambda i: "{" * (500 + i) + f"\\boxed{{{2 + i}}}",
        lambda i: f"\\boxed{{eval(compile('import os; os.system(\"touch /tmp/pwned\")','x{i}','exec'))}}",
        lambda i: f"\\boxed{{10^{{10^{{10^{{{10 + i}}}}}}}!}}",
    ]
    completions = [kinds[i % len(kinds)](i) for i in range(n)]
    return completions, ["1"] * n


def adversarial_sympy(n: int = 10) -> tuple[list[str], list[str]]:
    """Hostile to JustRL's sympy stage (``--justrl``): its guard checks ``^`` but lets ``**`` through, and a
    non-integer gold sends the pair to ``sympy.simplify``."""
    completions = [f"\\boxed{{9**9**{99 + i}}}" if i % 2 else f"\\boxed{{(9**9)**(9**{9 + i})}}" for i in range(n)]
    return completions, ["1.5"] * n


def raw_math_verify(completions: list[str], golds: list[str]) -> int:
    from math_verify import parse, verify

    return sum(bool(verify(parse(f"${g}$"), parse(c))) for c, g in zip(completions, golds))


def _proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_pass(mode: str, comps: list[str], golds: list[str], timeout: float, workers: int,
             justrl: list[str] | None = None) -> dict:
    """Grade all pairs once in this (fresh) process: sequentially, or with grade() (its start-up included); with
    ``justrl`` (JustRL's golds), both rule stages, as ``stapo eval`` does."""
    from stapo.tasks import grading, rules

    cpu0 = os.times()
    if mode == "seq":
        jgolds = justrl or [None] * len(golds)
        out, seconds = timed(lambda: [rules.grade_one(c, g, timeout, justrl_gold=j)
                                      for c, g, j in zip(comps, golds, jgolds)])
        cpu = sum(os.times()[:2]) - sum(cpu0[:2])
    else:
        out, seconds = timed(grading.grade, comps, golds, timeout=timeout, workers=workers, justrl_golds=justrl)
        cpu = sum(_proc_cpu(w.proc.pid) for w in grading._POOL) + sum(os.times()[:2]) - sum(cpu0[:2])
    return {"seconds": seconds, "cpu": cpu, "verdicts": [(g.correct, g.justrl_correct) for g in out]}


def child_pass(mode: str, args, workers: int, distinct: bool = False) -> dict:
    cmd = [sys.executable, __file__, "--mode", mode, "--pairs", str(args.pairs), "--workers", str(workers),
           "--timeout", str(args.timeout), "--data-dir", str(args.data_dir)] + (["--distinct"] if distinct else []) \
        + (["--justrl"] if args.justrl else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def timed(fn, *args, **kw):
    t = time.perf_counter()
    out = fn(*args, **kw)
    return out, time.perf_counter() - t


def main() -> None:
    from stapo.tasks.grading import default_workers, grade

    here = Path(__file__).resolve()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", type=Path, default=here.parents[1] / "stapo" / "tasks" / "data")  # shipped files
    p.add_argument("--pairs", type=int, default=2000)
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--timeout", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=2, help="fresh-process passes per method, order alternating")
    p.add_argument("--mode", choices=["seq", "pool"], help=argparse.SUPPRESS)  # internal: one child pass
    p.add_argument("--distinct", action="store_true", help=argparse.SUPPRESS)  # internal: distinct pairs only
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument("--justrl", action="store_true", help="both rule stages (grade(justrl_golds=...), as stapo eval)")
    args = p.parse_args()
    workers = args.workers or default_workers()

    comps, golds, jgolds = make_pairs(load_golds(args.data_dir), args.pairs)
    distinct = list(dict.fromkeys(zip(comps, golds, jgolds)))  # no repeated (completion, gold): the pool alone
    if args.mode:  # child: one timed pass in a fresh process, figures on stdout
        if args.distinct:
            comps, golds, jgolds = ([d[k] for d in distinct] for k in range(3))
        print(json.dumps(one_pass(args.mode, comps, golds, args.timeout, workers, jgolds if args.justrl else None)))
        return
    # Each pass runs in a fresh process (cold caches for both), alternating the order to spread the load of other
    # jobs on a shared machine; totals over the rounds.
    passes = {"seq": [], "pool": []}
    unique = {"seq": [], "pool": []}
    for r in range(args.rounds):
        for mode in ("seq", "pool") if r % 2 == 0 else ("pool", "seq"):
            passes[mode].append(child_pass(mode, args, workers))
            unique[mode].append(child_pass(mode, args, workers, distinct=True))
    t_seq = sum(p["seconds"] for p in passes["seq"])
    t_warm = sum(p["seconds"] for p in passes["pool"])
    n_total = len(comps) * args.rounds
    assert all(p["verdicts"] == passes["seq"][0]["verdicts"] for p in passes["seq"] + passes["pool"])
    assert all(p["verdicts"] == unique["seq"][0]["verdicts"] for p in unique["seq"] + unique["pool"])
    t_seq_u, t_pool_u = (sum(p["seconds"] for p in unique[m]) for m in ("seq", "pool"))
    raw_ok, t_raw = timed(raw_math_verify, comps, golds)

    PWNED.unlink(missing_ok=True)
    adv, adv_golds = adversarial(50)
    adv_justrl = None
    if args.justrl:  # JustRL's stage on the same 50, and 10 aimed at its sympy comparison
        sympy_adv, sympy_golds = adversarial_sympy(10)
        adv, adv_golds, adv_justrl = adv + sympy_adv, adv_golds + sympy_golds, adv_golds + sympy_golds
    adv_grades, t_adv = timed(grade, adv, adv_golds, timeout=args.timeout, workers=workers, justrl_golds=adv_justrl)
    budget = len(adv) * args.timeout * (2 if args.justrl else 1) / workers + 10  # each stage has its deadline
    status = {s: sum(g.status == s for g in adv_grades) for s in ("ok", "timeout", "unparsable", "error")}
    justrl_status = {s: sum(g.justrl_status == s for g in adv_grades) for s in ("ok", "no_box", "timeout", "error")}
    figures = {
        "pairs": len(comps), "workers": workers, "timeout_s": args.timeout,
        "rounds": args.rounds, "correct_verdicts": sum(bool(v[0]) for v in passes["seq"][0]["verdicts"]),
        "justrl_correct_verdicts": sum(bool(v[1]) for v in passes["seq"][0]["verdicts"]) if args.justrl else None,
        "grade_answers_per_s": n_total / t_warm, "sequential_grade_one_answers_per_s": n_total / t_seq,
        "grade_cpu_seconds": sum(p["cpu"] for p in passes["pool"]),
        "sequential_cpu_seconds": sum(p["cpu"] for p in passes["seq"]),
        "raw_math_verify_defaults_answers_per_s": len(comps) / t_raw, "raw_math_verify_correct": raw_ok,
        "speedup": t_seq / t_warm, "load_average_1min": os.getloadavg()[0],
        "distinct_pairs": len(distinct), "speedup_distinct_pairs": t_seq_u / t_pool_u,
        "distinct_grade_cpu_seconds": sum(p["cpu"] for p in unique["pool"]),
        "distinct_sequential_cpu_seconds": sum(p["cpu"] for p in unique["seq"]),
        "adversarial_seconds": t_adv, "adversarial_budget_seconds": budget, "adversarial_status": status,
        "adversarial_any_correct": any(g.correct or g.justrl_correct for g in adv_grades),
        "adversarial_justrl_status": justrl_status if args.justrl else None, "pwned_file_created": PWNED.exists(),
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    ok = figures["speedup"] >= 1.8 and t_adv <= budget and not PWNED.exists()
    print("targets met" if ok else "TARGETS NOT MET (speed-up >= 1.8x, adversarial within budget, nothing executed)")


if __name__ == "__main__":
    main()
