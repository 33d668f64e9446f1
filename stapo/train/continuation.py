"""A training run that outlives its job: leave at the next rollout boundary with a resumable checkpoint.

Clusters cap a job at 1-2 days; the paper's runs take 5-7 days on 64 GPUs (``stapo plan`` puts some at weeks). A run
is therefore continued over as many jobs as it takes, each resuming from the newest intact checkpoint (stapo.train.
rundir) to the same weights as one uninterrupted run.

What ends a job here, on every rank:
    SIGUSR1   the job's time is nearly up. The SLURM profile asks for it ``train_leave_before`` minutes ahead of the
              wall-time limit (``sbatch --signal=USR1@<seconds>``, workflow/rules/train.smk; SLURM may send it up to
              a minute early), so the lead must cover one rollout step and a checkpoint save.
    SIGTERM   the job is being stopped (scancel, preemption, the wall-time limit reached without warning). A second
              SIGTERM ends the process at once (the default action).
On either, the run trains on to the end of the current rollout step (an optimiser step at which ``global_step`` is a
multiple of k, the optimiser steps per rollout step: stapo.core.schedule), the ranks agree (one all-reduce per
rollout step), the trainer saves ``checkpoint-<step>`` there (also when no periodic checkpoint is due) and stops
before the next rollout; ``stapo train`` then exits with :data:`EXIT_CONTINUE` (75, EX_TEMPFAIL) and one line, and
writes no final/. Any later ``stapo train`` into the same directory continues it.

Who starts the next job: under the SLURM profile the train rule's shell requeues its own job on exit status 75
(``scontrol requeue $SLURM_JOB_ID``: the same job id goes back to the queue and reruns its batch script). Snakemake
sees a job that is pending again, not a failure, so continuations are unbounded and do not use the profile's
``retries``, which stay for real failures (any other exit status, a node failure, a kill). Elsewhere exit status 75
is a failure like any other: rerun the command (or Snakemake) to continue.
"""

from __future__ import annotations

import logging
import signal
import threading

from transformers import TrainerCallback

from stapo.core.errors import UserError

__all__ = ["EXIT_CONTINUE", "LEAVE_SIGNALS", "Continuation", "LeaveAtRolloutBoundary"]

log = logging.getLogger("stapo.train.continuation")
EXIT_CONTINUE = 75  # EX_TEMPFAIL: a checkpoint was saved on request; the run is not finished
LEAVE_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


class Continuation(UserError):
    """The run left at a rollout boundary on request (a signal), with a resumable checkpoint; not an error."""

    exit_status = EXIT_CONTINUE


class LeaveAtRolloutBoundary(TrainerCallback):
    """Turn SIGUSR1/SIGTERM into "save a checkpoint at the end of this rollout step and stop" (module docstring).

    ``steps_per_rollout``: k optimiser steps per rollout step. Handlers are installed by :meth:`install` (main thread
    only; a no-op elsewhere) and the previous ones restored by :meth:`restore`. ``received`` names the first signal.
    """

    def __init__(self, steps_per_rollout: int, reduce_max=None):
        self.k = steps_per_rollout
        self.received: str | None = None  # the first leave signal's name
        self.left_at: int | None = None  # the optimiser step whose checkpoint ends this job
        self.reduce_max = reduce_max  # int -> int, the largest over every rank (None: one process)
        self._previous: dict = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in LEAVE_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _on_signal(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.received == "SIGTERM" and signum == signal.SIGTERM:  # asked twice: stop now
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.raise_signal(signal.SIGTERM)
        if self.received is None or signum == signal.SIGTERM:
            self.received = name
        # no logging here (not async-signal-safe); on_step_end reports it

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.k:
            return  # inside a rollout step: its optimiser steps share one rollout batch
        asked = int(self.received is not None)
        if self.reduce_max is not None:
            asked = self.reduce_max(asked)  # every rank enters this at every rollout boundary
        if asked and state.global_step < state.max_steps:
            self.left_at = state.global_step
            control.should_save = True
            control.should_training_stop = True
            log.warning("%s received: saving checkpoint-%d at this rollout boundary and leaving (the next job "
                        "continues from it)", self.received or "a leave signal (another rank)", state.global_step)
        return control
