"""``stapo`` console script: one subcommand per stage (train, eval, report), each owned by its module.

Subcommand modules are imported lazily so that ``stapo --help`` stays fast and a stage's heavy imports
(TRL, lm-eval) are paid only by the stage that needs them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from stapo import study
from stapo.errors import UserError

# subcommand -> (module, one-line help); each module exposes add_arguments(parser) and run(args) -> int
SUBCOMMANDS = {
    "train": ("stapo.trainer", "train one (model, method) with the paper's recipe (TRL GRPOTrainer)"),
    "eval": ("stapo.evaluate", "evaluate a model on one benchmark at one sampling setting (lm-eval)"),
    "report": ("stapo.report", "write results/table.md, scores.csv, table.tex and the figures"),
    "plan": ("stapo.plan", "job counts and estimated GPU-hours of a study before running it"),
}


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; a UserError (bad config, missing file ...) is one line on stderr and exit status 2.

    ``--debug`` (anywhere in argv) or ``STAPO_DEBUG=1`` re-raises it with its traceback.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("STAPO_DEBUG", "0") not in ("", "0")
    argv = [a for a in argv if a != "--debug"]
    try:
        _precheck(argv)
        return _run(argv)
    except UserError as err:
        if debug:
            raise
        name = argv[0] if argv and argv[0] in SUBCOMMANDS else ""
        print(f"stapo {name}: error: " + " ".join(str(err).split("\n")), file=sys.stderr)
        return 2


def _precheck(argv: list[str]) -> None:
    """stapo train: validate the study and the (model, method) run before the trainer's imports (torch, TRL)."""
    if not argv or argv[0] != "train":
        return
    pre = argparse.ArgumentParser(add_help=False)
    for flag in ("--recipe", "--model", "--method"):
        pre.add_argument(flag)
    known = pre.parse_known_args(argv[1:])[0]
    if known.recipe:
        recipe = study.read(known.recipe, required=study.TRAIN_SECTIONS, check_runs=False)
        if known.model and known.method:
            recipe.plan(known.model, known.method)


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="stapo", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show the traceback of configuration errors too "
                        "(or STAPO_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(SUBCOMMANDS) + "}")
    name = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    for cmd, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(cmd, help=help_text)
        if cmd == name:  # import only the module that runs
            importlib.import_module(module).add_arguments(p)
    args = parser.parse_args(argv)
    return int(importlib.import_module(SUBCOMMANDS[args.command][0]).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
