"""Rule-based grading of model completions against gold answers, in a pool of worker processes: ``grade(completions,
golds)`` returns one :class:`stapo.tasks.rules.Grade` per pair (the rule stages and their verdicts: stapo.tasks.rules).

Each answer has ``timeout`` seconds of wall clock, enforced twice: inside the worker by one SIGALRM deadline around
the whole answer, which ends a slow Python-level computation and keeps the worker and its warm parser caches; and by
the parent, ``HARD_GRACE`` s later, for a worker stuck in C (sympy on ``9^{9^{9^{9}}}``), which is killed and
replaced. Either way the answer gets ``status="timeout"`` and the batch continues. (Killing at the first deadline
costs the replacement's warm-up: ANTLR and sympy caches fill over the first few hundred answers, and that alone cut
the pool's speed-up on 2 cores from ~1.9x to ~1.5x in benchmarks/bench_grading.py.) Workers also run under an
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
import threading
import time
from collections import deque
from multiprocessing.connection import wait

from stapo.tasks import justrl_grading
from stapo.tasks.rules import _TOO_LONG_MARK, Grade, _choose, _failed, _grade_justrl, _grade_parts, _parts

__all__ = ["Grade", "grade", "default_workers", "shutdown"]

WORKER_MEMORY_BYTES = 3 << 30  # RLIMIT_AS per worker
PIPELINE_DEPTH = 3  # jobs queued per worker
HARD_GRACE = 1.0  # s past an answer's deadline before the parent kills a worker that did not stop on its own


# --------------------------------------------------------------------------------------------- worker pool


def _worker_main(conn, memory_bytes: int) -> None:
    """Worker loop: receive (box, tail, gold, timeout, justrl job or None), send back the verdicts dict; exits on
    None or EOF."""
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
        box, tail, gold, timeout, justrl = job
        try:
            result = _grade_parts(box, tail, gold, timeout)
        except (MemoryError, Exception):  # math-verify on exotic input: a wrong answer, not a crash of the batch
            result = _failed(box, tail, "error")
        conn.send({**result, **_grade_justrl(justrl, timeout)})


def _context():
    """forkserver (safe from threads, fast replacements) with math-verify preloaded; spawn where unavailable."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["math_verify", "stapo.tasks.grading", "pylatexenc.latex2text"])
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

    def submit(self, index: int, parts: tuple, gold: str, timeout: float) -> None:
        """Send one job: ``parts`` = (final box, tail, JustRL job or None); each stage has ``timeout`` s."""
        # only the final box and the tail are graded: small messages, so the pipe never blocks us
        box, tail, justrl = parts
        self.conn.send((box, tail, gold, timeout, justrl))
        if not self.jobs:
            self.head_since = time.monotonic()
        self.jobs.append(index)
        self.timeout = timeout * (1 if justrl is None else 2)  # the stages' deadlines run one after the other

    def receive(self) -> tuple[int, dict]:
        """The head job's verdicts (raises EOFError/OSError if the worker died)."""
        grade_ = self.conn.recv()
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


def grade(completions: list[str], golds: list[str], *, timeout: float = 5.0, workers: int | None = None,
          strict: bool = False, justrl_golds: list[str] | None = None) -> list[Grade]:
    """Grade ``completions[i]`` against ``golds[i]``, in parallel worker processes, ``timeout`` s wall per answer.

    ``strict=True``: ``Grade.correct`` is the final-box verdict (reported accuracy, ``stapo eval``); the default
    ``False`` keeps the lenient fallback as ``correct`` (the ``math_verify`` training reward). Both verdicts are in
    every Grade either way (one grading pass). With ``justrl_golds`` (JustRL's gold strings, one per completion),
    each Grade also has JustRL's rule verdict (``justrl_correct``), graded in the same pass.
    Identical pairs (same final box, or same tail without one, and same gold) are graded once (``_unique_jobs``).
    """
    if len(completions) != len(golds):
        raise ValueError(f"grade: {len(completions)} completions but {len(golds)} golds")
    if justrl_golds is not None and len(justrl_golds) != len(golds):
        raise ValueError(f"grade: {len(golds)} golds but {len(justrl_golds)} JustRL golds")
    if justrl_golds is not None:
        justrl_grading._latex_to_text()  # a missing pylatexenc fails here, not as an "error" verdict per sample
    if not completions:
        return []
    parts, unique_golds, first_of = _unique_jobs(completions, golds, justrl_golds)
    n_workers = max(1, min(workers or default_workers(), len(parts)))
    ctx = _context()
    results: list[dict | None] = [None] * len(parts)
    with _POOL_LOCK:
        pool = _take_workers(ctx, n_workers)
        try:
            _run_pool(pool, ctx, parts, unique_golds, timeout, results)
        finally:
            for w in pool:
                if w.jobs:  # interrupted mid-batch: its late answers must not reach the next call
                    w.kill()
            _POOL[:] = [w for w in pool if not w.jobs] + _POOL[n_workers:]
    return [_choose(results[j], strict) for j in first_of]  # type: ignore[arg-type]


def _unique_jobs(completions, golds, justrl_golds=None) -> tuple[list[tuple], list[str], list[int]]:
    """The distinct grading jobs: (their parts, their golds, and for each pair the index of its job).

    A verdict depends only on the final box (or, without a usable one, the tail the fallback reads), the gold and
    the JustRL job (its box and gold), so identical pairs are graded once: avg@N's samples of one problem often end
    in the same box.
    """
    index: dict[tuple, int] = {}
    parts, unique_golds, first_of = [], [], []
    for k, (completion, gold) in enumerate(zip(completions, golds)):
        box, tail, justrl = _parts(str(completion), None if justrl_golds is None else justrl_golds[k])
        usable = box is not None and box != _TOO_LONG_MARK
        key = (box, None if usable else tail, str(gold), justrl)
        j = index.setdefault(key, len(parts))
        if j == len(parts):
            parts.append((box, tail, justrl))
            unique_golds.append(str(gold))
        first_of.append(j)
    return parts, unique_golds, first_of


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


def _run_pool(pool, ctx, parts, golds, timeout, results) -> None:
    """Dispatch loop: keep every worker's queue (``_gold_queues``, ``_next_job``) filled, collect answers, kill and
    replace workers past a deadline."""
    queues = _gold_queues(golds, len(pool))

    def fail(k: int, status: str | None) -> None:
        """Kill worker k; its head job gets ``status`` (None: requeue it too); queued jobs go back to its queue."""
        w = pool[k]
        if w.jobs and status is not None:
            i = w.jobs.popleft()
            box, tail, justrl = parts[i]
            results[i] = _failed(box, tail, status, justrl)
        queues[k].extendleft(reversed(w.jobs))
        w.jobs.clear()
        w.kill()
        pool[k] = _Worker(ctx)

    while any(queues) or any(w.jobs for w in pool):
        for k in range(len(pool)):
            while len(pool[k].jobs) < PIPELINE_DEPTH and (i := _next_job(queues, k)) is not None:
                try:
                    pool[k].submit(i, parts[i], golds[i], timeout)
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
