"""The signals that ask a training job to leave, recorded from the first moment of ``stapo train`` (no heavy import).

SIGUSR1 (the SLURM profile's ``--signal=USR1@<seconds>`` ahead of the wall-time limit) and SIGTERM (scancel,
preemption, a limit reached without warning) are recorded by :func:`record`, which ``stapo train`` installs before it
imports torch: a signal that arrives while the model loads is not lost, and not fatal. The trainer
(stapo.train.continuation) answers it at its next rollout boundary: a checkpoint, then exit status
:data:`EXIT_CONTINUE`, and the marker file :data:`CONTINUE_MARK` in the run directory (written by rank 0 once the
checkpoint is complete), which the workflow's train rule reads to requeue the job: under ``accelerate launch`` the
launcher turns a worker's exit status into its own failure (1), so the status alone cannot say "continue". A second
SIGTERM ends the process at once (the default action).
"""

from __future__ import annotations

import signal
import threading

from stapo.core.errors import UserError

__all__ = ["EXIT_CONTINUE", "CONTINUE_MARK", "LEAVE_SIGNALS", "Continuation", "record", "received", "restore"]

EXIT_CONTINUE = 75  # EX_TEMPFAIL: a checkpoint was saved on request; the run is not finished
CONTINUE_MARK = "stapo.continue"  # in the run directory: this job left to be continued (its content: step, signal)
LEAVE_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)

_received: list[str] = []  # names of the leave signals received, in order
_previous: dict = {}


class Continuation(UserError):
    """The run left at a rollout boundary on request (a signal), with a resumable checkpoint; not an error."""

    exit_status = EXIT_CONTINUE


def _on_signal(signum, frame) -> None:
    if signum == signal.SIGTERM and "SIGTERM" in _received:  # asked twice: stop now
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)
    _received.append(signal.Signals(signum).name)  # no logging here (not async-signal-safe)


def record() -> None:
    """Record SIGUSR1/SIGTERM from now on (main thread only; elsewhere a no-op). Idempotent."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in LEAVE_SIGNALS:
        if sig not in _previous:
            _previous[sig] = signal.signal(sig, _on_signal)


def received() -> str | None:
    """The name of the first leave signal received (SIGTERM wins: the job is being stopped), or None."""
    if not _received:
        return None
    return "SIGTERM" if "SIGTERM" in _received else _received[0]


def restore() -> None:
    """The handlers that were there before :func:`record`; forget what was received."""
    for sig, handler in _previous.items():
        signal.signal(sig, handler)
    _previous.clear()
    _received.clear()
