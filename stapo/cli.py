"""``stapo`` console script: one subcommand per stage (train, eval, report), each owned by its module.

Subcommand modules are imported lazily so that ``stapo --help`` stays fast and a stage's heavy imports
(TRL, lm-eval) are paid only by the stage that needs them.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, one-line help); each module exposes add_arguments(parser) and run(args) -> int
SUBCOMMANDS = {
    "train": ("stapo.trainer", "train one (model, method) with the paper's recipe (TRL GRPOTrainer)"),
    "eval": ("stapo.evaluate", "evaluate a model on one benchmark at one sampling setting (lm-eval)"),
    "report": ("stapo.report", "write results/table.md, scores.csv, table.tex and the figures"),
    "plan": ("stapo.plan", "job counts and estimated GPU-hours of a study before running it"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="stapo", description=__doc__.splitlines()[0])
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
