"""The one exception type the ``stapo`` console script reports as a single line (no traceback).

A :class:`UserError` is a mistake the user can fix (a bad key or value, YAML syntax, a missing file, a run directory
started with another config); its message names the culprit (key, file, line). Everything else is a bug or an
environment failure and keeps its traceback. ``stapo --debug ...`` or ``STAPO_DEBUG=1`` shows the traceback of a
UserError too.
"""

from __future__ import annotations

import argparse

__all__ = ["UserError", "ArgumentParser"]


class UserError(Exception):
    """A fixable mistake in the user's input; ``str(err)`` is the whole message (one line, names the culprit)."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one line, without the usage block: ``stapo train: error: the following arguments
    are required: --recipe (see stapo train --help)``, exit status 2. Subparsers inherit it."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")
