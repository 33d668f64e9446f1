"""Rule-based grading of model completions against gold answers (math-verify), in a pool of worker processes.

``grade(completions, golds)`` returns one :class:`Grade` per pair:

1. The completion is bounded to its last ``MAX_COMPLETION_CHARS`` characters (the answer is at the end; a 1 MB
   completion must not cost a 1 MB parse).
2. The answer is the content of the last ``\\boxed{...}`` (nested braces; ``stapo.rewards.last_boxed``, the same
   extraction as the training reward); without a box, math-verify's own LaTeX extraction looks for one, and
   without any LaTeX, the last plain number of the text (a regex; small models often answer "... = 19.").
3. math-verify (LaTeX extraction only) parses prediction and gold and checks symbolic equivalence.

Model output is text, never code: we never eval/exec/sympify it, and math-verify's ``ExprExtractionConfig`` (which
calls ``sympy.parse_expr``, an ``eval``) is deliberately not used. Each answer has ``timeout`` seconds of wall clock,
enforced twice: inside the worker by one SIGALRM deadline around the whole answer (parse, gold, verify; math-verify's
own per-call alarms are off), which ends a slow Python-level computation and keeps the worker and its warm parser
caches; and by the parent, ``HARD_GRACE`` s later, for a worker stuck in C (sympy on ``9^{9^{9^{9}}}``), which is
killed and replaced. Either way the answer gets ``status="timeout"`` and the batch continues. (Killing at the first
deadline costs the replacement's warm-up: ANTLR and sympy caches fill over the first few hundred answers, and that
alone cut the pool's speed-up on 2 cores from ~1.9x to ~1.5x in benchmarks/bench_grading.py.) Workers also run under an
address-space limit, so a runaway big-integer power fails with MemoryError instead of swapping the machine.

The parent uses no signals, so ``grade`` works from any thread (Snakemake ``run:`` blocks, thread pools).
Workers come from a ``forkserver`` that preloads math-verify once: a replacement worker starts in milliseconds.
They persist between calls (warm caches), and ``grade`` calls from several threads take turns.
As with any multiprocessing start method other than fork, a script that calls ``grade`` must guard its entry point
(``if __name__ == "__main__":``): workers import the main module.
"""

from __future__ import annotations

import atexit
import logging
import math
import multiprocessing as mp
import os
import re
import signal
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import lru_cache
from multiprocessing.connection import wait

from stapo.rewards import last_boxed, normalize_answer

__all__ = ["Grade", "grade", "grade_one", "extract_answer", "last_number", "MAX_COMPLETION_CHARS", "STATUSES"]

MAX_COMPLETION_CHARS = 4096  # only the tail of a completion is parsed
WORKER_MEMORY_BYTES = 3 << 30  # RLIMIT_AS per worker
PIPELINE_DEPTH = 3  # jobs queued per worker
HARD_GRACE = 1.0  # s past an answer's deadline before the parent kills a worker that did not stop on its own
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


def _parse_latex(text: str):
    from math_verify import LatexExtractionConfig, parse

    return parse(text, extraction_config=[LatexExtractionConfig(boxed_match_priority=0)], parsing_timeout=None)


@lru_cache(maxsize=4096)
def _parse_gold(gold: str):
    """Gold answers repeat N times per problem (avg@N): parse each once per worker."""
    return _parse_latex(f"${gold}$")


class _Timeout(BaseException):
    """Raised at an answer's deadline; a BaseException, like math-verify's own, so its ``except Exception`` passes it."""


@contextmanager
def _deadline(seconds: float):
    """SIGALRM after ``seconds`` of wall clock raises :class:`_Timeout` (main thread only)."""

    def expire(signum, frame):
        raise _Timeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class _OwnTimeouts(logging.Filter):
    """math-verify warns that its timeouts are off: ours (``_deadline``) replace them."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.grader", "math_verify.parser"):
    logging.getLogger(_name).addFilter(_OwnTimeouts())


def grade_one(completion: str, gold: str, timeout: float = 5.0) -> Grade:
    """Grade one completion in THIS process, within ``timeout`` s (a SIGALRM deadline: call from a main thread).

    This is what a worker runs; ``grade`` adds the process pool and the hard deadline around it.
    """
    tail = completion[-MAX_COMPLETION_CHARS:]
    try:
        with _deadline(timeout):
            return _grade_tail(tail, str(gold))
    except _Timeout:
        return Grade(False, extract_answer(tail), "timeout")


def _grade_tail(tail: str, gold: str) -> Grade:
    from math_verify import verify

    boxed = last_boxed(tail)
    pred = _parse_latex(f"${boxed}$" if boxed is not None else tail)
    extracted = boxed if boxed is not None else (str(pred[-1]) if pred else None)
    if not pred and boxed is None:
        # Plain-text answers ("... = 19."): the last number, found by a regex and parsed as LaTeX (still no eval).
        number = last_number(tail)
        if number is not None:
            extracted, pred = number, _parse_latex(f"${number}$")
    gold_parsed = _parse_gold(gold)
    if not pred or not gold_parsed:
        # Not parsable as LaTeX (e.g. "\text{Evelyn}" vs a name): fall back to the normalised string match.
        if extracted is not None and normalize_answer(extracted) == normalize_answer(gold):
            return Grade(True, extracted, "ok")
        return Grade(False, extracted, "unparsable")
    return Grade(bool(verify(gold_parsed, pred, timeout_seconds=None)), extracted, "ok")


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
        """When the parent kills this worker: the head job's own deadline (in the worker) plus ``HARD_GRACE``."""
        return self.head_since + self.timeout + HARD_GRACE if self.jobs else math.inf

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
            _run_pool(pool, ctx, completions, golds, timeout, results)
        finally:
            for w in pool:
                if w.jobs:  # interrupted mid-batch: its late answers must not reach the next call
                    w.kill()
            _POOL[:] = [w for w in pool if not w.jobs] + _POOL[n_workers:]
    return results  # type: ignore[return-value]


def _gold_queues(golds, n: int) -> list[deque]:
    """Indices of the pairs, one queue per worker, all answers to one gold in the same queue (in order).

    The worker then parses that gold once: gold parsing is most of the work when N samples share a problem (avg@N),
    and round-robin dispatch made every worker parse almost every gold.
    """
    queues = [deque() for _ in range(n)]
    for i, gold in enumerate(golds):
        queues[hash(str(gold)) % n].append(i)
    return queues


def _next_job(queues: list[deque], k: int) -> int | None:
    """Worker k's next pair: the head of its own queue, else (it would idle) the back of the longest queue."""
    if queues[k]:
        return queues[k].popleft()
    longest = max(queues, key=len)
    return longest.pop() if longest else None


def _run_pool(pool, ctx, completions, golds, timeout, results) -> None:
    """Dispatch loop: keep every worker's queue filled, collect answers, kill and replace workers past a deadline.

    Work is dispatched from per-worker queues (``_gold_queues``, ``_next_job``).
    """
    queues = _gold_queues(golds, len(pool))

    def fail(k: int, status: str | None) -> None:
        """Kill worker k; its head job gets ``status`` (None: requeue it too); queued jobs go back to its queue."""
        w = pool[k]
        if w.jobs and status is not None:
            i = w.jobs.popleft()
            results[i] = Grade(False, extract_answer(str(completions[i])), status)
        queues[k].extendleft(reversed(w.jobs))
        w.jobs.clear()
        w.kill()
        pool[k] = _Worker(ctx)

    while any(queues) or any(w.jobs for w in pool):
        for k in range(len(pool)):
            while len(pool[k].jobs) < PIPELINE_DEPTH and (i := _next_job(queues, k)) is not None:
                try:
                    pool[k].submit(i, str(completions[i]), str(golds[i]), timeout)
                except OSError:  # the worker died: its running job is an error, the rest are retried
                    queues[k].appendleft(i)
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
