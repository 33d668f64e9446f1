"""A training run that outlives its job: leave at the next rollout boundary with a resumable checkpoint.

Clusters cap a job at 1-2 days; the paper's runs take 5-7 days on 64 GPUs (``stapo plan`` puts some at weeks). A run
is therefore continued over as many jobs as it takes, each resuming from the newest intact checkpoint (stapo.train.
rundir) to the same weights as one uninterrupted run.

What ends a job here, on every rank (recorded from the start of ``stapo train``: stapo.core.leave):
    SIGUSR1   the job's time is nearly up. The SLURM profile asks for it ``workflow.train_leave_before`` seconds ahead
              of the wall-time limit (``sbatch --signal=USR1@<seconds>``, workflow/rules/train.smk; SLURM may send it
              up to a minute early), so the lead must cover one rollout step and a checkpoint save.
    SIGTERM   the job is being stopped (scancel, preemption, the wall-time limit reached without warning). A second
              SIGTERM ends the process at once.
On either, the run trains on to the end of the current rollout step (an optimiser step at which ``global_step`` is a
multiple of k, the optimiser steps per rollout step: stapo.core.schedule), the ranks agree (one all-reduce per
rollout step), the trainer saves ``checkpoint-<step>`` there (also when no periodic checkpoint is due) and stops
before the next rollout; ``stapo train`` then writes the marker ``stapo.continue`` into the run directory, exits with
status 75 (EX_TEMPFAIL) and one line, and writes no final/. Any later ``stapo train`` into the directory continues.

Who starts the next job: under SLURM the train rule's shell requeues its own job when the marker is there
(``scontrol requeue $SLURM_JOB_ID``: the same job id goes back to the queue and reruns its batch script). Snakemake
sees a job that is pending again, not a failure, so continuations are unbounded and do not use the profile's
``retries``, which stay for real failures (no marker: any other exit, a node failure, a kill). Elsewhere exit
status 75 is a failure like any other: rerun the command (or Snakemake) to continue.
"""

from __future__ import annotations

import logging

from transformers import TrainerCallback

from stapo.core import leave

__all__ = ["LeaveAtRolloutBoundary"]

log = logging.getLogger("stapo.train.continuation")


class LeaveAtRolloutBoundary(TrainerCallback):
    """Turn a recorded SIGUSR1/SIGTERM (stapo.core.leave) into "save a checkpoint at the end of this rollout step and
    stop". ``steps_per_rollout``: k; ``reduce_max``: int -> the largest over every rank (None: one process)."""

    def __init__(self, steps_per_rollout: int, reduce_max=None):
        self.k = steps_per_rollout
        self.reduce_max = reduce_max
        self.left_at: int | None = None  # the optimiser step whose checkpoint ends this job
        self.received: str | None = None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.k:
            return control  # inside a rollout step: its optimiser steps share one rollout batch
        asked = int(leave.received() is not None)
        if self.reduce_max is not None:
            asked = self.reduce_max(asked)  # every rank enters this at every rollout boundary
        if asked and state.global_step < state.max_steps:
            self.left_at, self.received = state.global_step, leave.received() or "a leave signal (another rank)"
            control.should_save = True
            control.should_training_stop = True
            log.warning("%s received: saving checkpoint-%d at this rollout boundary and leaving (the next job "
                        "continues from it)", self.received, state.global_step)
        return control
