"""Rule-based grading of model completions against gold answers (math-verify), in a pool of worker processes.

``grade(completions, golds)`` returns one :class:`Grade` per pair:

1. The completion is bounded to its last ``MAX_COMPLETION_CHARS`` characters (the answer is at the end; a 1 MB
   completion must not cost a 1 MB parse).
2. The answer is the content of the last ``\\boxed{...}`` (nested braces; ``stapo.rewards.last_boxed``, the same
   extraction as the training reward); without a box, math-verify's own LaTeX extraction looks for one, and
   without any LaTeX, the last plain number of the text (a regex; small models often answer "... = 19.").
3. math-verify (LaTeX extraction only) parses prediction and gold and checks symbolic equivalence.

Model output is text, never code: we never eval/exec/sympify it, and math-verify's ``ExprExtractionConfig`` (which
calls ``sympy.parse_expr``, an ``eval``) is deliberately not used. Each answer runs in a worker process under a hard
wall-clock deadline enforced by the parent: a worker that overruns (sympy stuck in C on ``9^{9^{9^{9}}}``) is
killed and replaced, its answer gets ``status="timeout"``, and the batch continues. Workers also run under an
address-space limit, so a runaway big-integer power fails with MemoryError instead of swapping the machine.

The parent uses no signals, so ``grade`` works from any thread (Snakemake ``run:`` blocks, thread pools).
Workers come from a ``forkserver`` that preloads math-verify once: a replacement worker starts in milliseconds.
They persist between calls (warm caches), and ``grade`` calls from several threads take turns.
As with any multiprocessing start method other than fork, a script that calls ``grade`` must guard its entry point
(``if __name__ == "__main__":``): workers import the main module.
"""

from __future__ import annotations

import atexit
import math
import multiprocessing as mp
import os
import re
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from functools import lru_cache
from multiprocessing.connection import wait

from stapo.rewards import last_boxed, normalize_answer

__all__ = ["Grade", "grade", "grade_one", "extract_answer", "last_number", "MAX_COMPLETION_CHARS", "STATUSES"]

MAX_COMPLETION_CHARS = 4096  # only the tail of a completion is parsed
WORKER_MEMORY_BYTES = 3 << 30  # RLIMIT_AS per worker
PIPELINE_DEPTH = 3  # jobs queued per worker
STATUSES = ("ok", "timeout", "unparsable", "error")


@dataclass(frozen=True)
class Grade:
    """Verdict for one completion.

    correct:   math-verify says the extracted answer equals the gold answer.
    extracted: the answer text that was graded (last \\boxed{} content, or math-verify's match), None if none.
    status:    "ok" (graded), "timeout" (killed at the deadline), "unparsable" (no answer found / not parsable),
               "error" (the worker crashed, e.g. out of memory).
    """

    correct: bool
    extracted: str | None
    status: str

    def to_dict(self) -> dict:
        return asdict(self)


def extract_answer(completion: str) -> str | None:
    """The last ``\\boxed{...}`` content in the bounded tail of ``completion`` (None if there is no box)."""
    return last_boxed(completion[-MAX_COMPLETION_CHARS:])


_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")


def last_number(text: str) -> str | None:
    """The last number in ``text`` (integers, decimals, a/b, thousands separators dropped), or None."""
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


def _parse_latex(text: str, seconds: int):
    from math_verify import LatexExtractionConfig, parse

    return parse(text, extraction_config=[LatexExtractionConfig(boxed_match_priority=0)], parsing_timeout=seconds)


@lru_cache(maxsize=4096)
def _parse_gold(gold: str, seconds: int):
    """Gold answers repeat N times per problem (avg@N): parse each once per worker."""
    return _parse_latex(f"${gold}$", seconds)


def grade_one(completion: str, gold: str, timeout: float = 5.0) -> Grade:
    """Grade one completion in THIS process (math-verify's SIGALRM timeouts: call from a main thread).

    This is what a worker runs; ``grade`` adds the process pool and the hard deadline around it.
    """
    from math_verify import verify

    seconds = max(1, math.ceil(timeout))
    tail = completion[-MAX_COMPLETION_CHARS:]
    boxed = last_boxed(tail)
    pred = _parse_latex(f"${boxed}$" if boxed is not None else tail, seconds)
    extracted = boxed if boxed is not None else (str(pred[-1]) if pred else None)
    if not pred and boxed is None:
        # Plain-text answers ("... = 19."): the last number, found by a regex and parsed as LaTeX (still no eval).
        number = last_number(tail)
        if number is not None:
            extracted, pred = number, _parse_latex(f"${number}$", seconds)
    gold_parsed = _parse_gold(str(gold), seconds)
    if not pred or not gold_parsed:
        # Not parsable as LaTeX (e.g. "\text{Evelyn}" vs a name): fall back to the normalised string match.
        if extracted is not None and normalize_answer(extracted) == normalize_answer(str(gold)):
            return Grade(True, extracted, "ok")
        return Grade(False, extracted, "unparsable")
    correct = bool(verify(gold_parsed, pred, timeout_seconds=seconds))
    return Grade(correct, extracted, "ok")


# --------------------------------------------------------------------------------------------- worker pool


def _worker_main(conn, memory_bytes: int) -> None:
    """Worker loop: receive (completion, gold, timeout), send back a Grade dict; exits on None or EOF."""
    import resource

    if memory_bytes:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, hard))
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        completion, gold, timeout = job
        try:
            result = grade_one(completion, gold, timeout).to_dict()
        except MemoryError:
            result = {"correct": False, "extracted": extract_answer(completion), "status": "error"}
        except Exception:  # math-verify on exotic input: a wrong answer, not a crash of the batch
            result = {"correct": False, "extracted": extract_answer(completion), "status": "error"}
        conn.send(result)


def _context():
    """forkserver (safe from threads, fast replacements) with math-verify preloaded; spawn where unavailable."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["math_verify", "stapo.grading"])
    return ctx


class _Worker:
    """One worker process, the parent's end of its pipe, and the jobs sent to it (answered in order).

    Up to ``PIPELINE_DEPTH`` jobs are queued per worker so that it never idles waiting for the parent to be
    scheduled (on a loaded machine that wait, not grading, dominated). Only the head job runs; its deadline starts
    when it became the head (submission, or arrival of the previous answer: a little late, so never too strict).
    """

    def __init__(self, ctx):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, WORKER_MEMORY_BYTES), daemon=True)
        self.proc.start()
        child.close()
        self.jobs: deque[int] = deque()  # indices of the pairs sent, oldest (running) first
        self.head_since = math.inf

    @property
    def deadline(self) -> float:
        return self.head_since + self.timeout if self.jobs else math.inf

    def submit(self, index: int, completion: str, gold: str, timeout: float) -> None:
        # only the tail is graded: sending just the tail keeps every message small (the pipe never blocks us)
        self.conn.send((completion[-MAX_COMPLETION_CHARS:], gold, timeout))
        if not self.jobs:
            self.head_since = time.monotonic()
        self.jobs.append(index)
        self.timeout = timeout

    def receive(self) -> tuple[int, Grade]:
        """The head job's answer (raises EOFError/OSError if the worker died)."""
        grade_ = Grade(**self.conn.recv())
        index = self.jobs.popleft()
        self.head_since = time.monotonic()
        return index, grade_

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(5)
        self.conn.close()

    def close(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.proc.join(1)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(1)
        self.conn.close()


def default_workers() -> int:
    """CPUs this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


# Workers stay alive between grade() calls (their math-verify / sympy caches warm); one grade() at a time.
_POOL: list[_Worker] = []
_POOL_LOCK = threading.Lock()


def _take_workers(ctx, n: int) -> list[_Worker]:
    """``n`` live workers from the persistent pool (starting any that are missing)."""
    _POOL[:] = [w for w in _POOL if w.proc.is_alive()]
    while len(_POOL) < n:
        _POOL.append(_Worker(ctx))
    return _POOL[:n]


@atexit.register
def shutdown() -> None:
    """Stop the persistent workers (also runs at interpreter exit)."""
    with _POOL_LOCK:
        for w in _POOL:
            w.close()
        _POOL.clear()


def grade(completions: list[str], golds: list[str], *, timeout: float = 5.0, workers: int | None = None) -> list[Grade]:
    """Grade ``completions[i]`` against ``golds[i]``, in parallel worker processes, ``timeout`` s wall per answer."""
    if len(completions) != len(golds):
        raise ValueError(f"grade: {len(completions)} completions but {len(golds)} golds")
    if not completions:
        return []
    n_workers = max(1, min(workers or default_workers(), len(completions)))
    ctx = _context()
    results: list[Grade | None] = [None] * len(completions)
    with _POOL_LOCK:
        pool = _take_workers(ctx, n_workers)
        try:
            _run_pool(pool, ctx, deque(range(len(completions))), completions, golds, timeout, results)
        finally:
            for w in pool:
                if w.jobs:  # interrupted mid-batch: its late answers must not reach the next call
                    w.kill()
            _POOL[:] = [w for w in pool if not w.jobs] + _POOL[n_workers:]
    return results  # type: ignore[return-value]


def _run_pool(pool, ctx, todo, completions, golds, timeout, results) -> None:
    """Dispatch loop: keep every worker's queue filled, collect answers, kill and replace workers past a deadline."""

    def fail(k: int, status: str | None) -> None:
        """Kill worker k; its head job gets ``status`` (None: requeue it too); queued jobs go back to ``todo``."""
        w = pool[k]
        if w.jobs and status is not None:
            i = w.jobs.popleft()
            results[i] = Grade(False, extract_answer(str(completions[i])), status)
        todo.extendleft(reversed(w.jobs))
        w.jobs.clear()
        w.kill()
        pool[k] = _Worker(ctx)

    while todo or any(w.jobs for w in pool):
        for k, w in enumerate(pool):
            while todo and len(pool[k].jobs) < PIPELINE_DEPTH:
                i = todo.popleft()
                try:
                    pool[k].submit(i, str(completions[i]), str(golds[i]), timeout)
                except OSError:  # the worker died: its running job is an error, the rest are retried
                    todo.appendleft(i)
                    fail(k, "error" if pool[k].jobs else None)
        busy = [w for w in pool if w.jobs]
        wait_s = max(0.0, min(w.deadline for w in busy) - time.monotonic())
        ready = set(wait([w.conn for w in busy], timeout=wait_s))
        for k, w in enumerate(pool):
            try:
                while w.jobs and w.conn in ready and w.conn.poll():
                    i, results[i] = w.receive()
            except (EOFError, OSError):  # the worker died (e.g. aborted on a huge allocation)
                fail(k, "error")
                continue
            if w.jobs and time.monotonic() >= w.deadline:
                fail(k, "timeout")
