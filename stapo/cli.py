"""``stapo`` console script: one subcommand per stage (train, eval, report, plan), each owned by its module.

Every user error is one line on stderr, exit status 2, and arrives before any heavy import or model load: the
arguments are parsed first (argparse's own errors too are one line), then the whole study file is validated
(stapo.study.parse, the one validation every entry point runs), then what the command writes is checked and locked
(one writer per run directory / evaluation output, stapo.core.lock), and only then is the stage's module imported
(``stapo train``'s trainer pulls in torch and TRL, ~10-40 s). ``--debug`` (anywhere) or ``STAPO_DEBUG=1`` shows
the traceback of a user error too.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from contextlib import ExitStack
from pathlib import Path

from stapo.core import driver

from stapo import study
from stapo.core import leave
from stapo.core.atomic import check_creatable_dir, refuse_links
from stapo.core.errors import ArgumentParser, UserError

# subcommand -> (module, one-line help); each module exposes run(args) -> int, and add_arguments(parser) except
# the trainer, whose module is heavy: its arguments are defined here (train_arguments)
SUBCOMMANDS = {
    "train": ("stapo.train.trainer", "train one (model, method) with the paper's recipe (TRL GRPOTrainer)"),
    "eval": ("stapo.eval.evaluate", "evaluate a model on one benchmark at one sampling setting (lm-eval)"),
    "report": ("stapo.report.table", "write results/table.md, scores.csv, table.tex and the figures"),
    "plan": ("stapo.plan", "job counts and estimated GPU-hours of a study before running it"),
    "schema": ("stapo.study.schema", "print the study schema (YAML), generated from the section dataclasses"),
}


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; a UserError (bad argument, config, missing file, busy output ...) is one line on stderr
    and exit status 2. ``--debug`` (anywhere in argv) or ``STAPO_DEBUG=1`` re-raises it with its traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    driver.watch()  # a workflow job dies with the Snakemake process that started it (stapo.core.driver)
    debug = "--debug" in argv or os.environ.get("STAPO_DEBUG", "0") not in ("", "0")
    argv = [a for a in argv if a != "--debug"]
    name = argv[0] if argv and argv[0] in SUBCOMMANDS else ""
    if name == "train":  # before any heavy import: a leave signal during start-up is answered, not fatal
        leave.record()
    try:
        with ExitStack() as held:
            args = parse_args(argv)
            precheck(args, held)
            return int(importlib.import_module(SUBCOMMANDS[args.command][0]).run(args) or 0)
    except UserError as err:
        status = getattr(err, "exit_status", 2)  # a Continuation (stapo.train.continuation) is not an error
        if debug and status == 2:
            raise
        prefix = f"stapo {name}: " + ("error: " if status == 2 else "") if name else "stapo: error: "
        print(prefix + " ".join(str(err).split()), file=sys.stderr)
        return status


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line, parsed without importing any stage's heavy dependencies."""
    parser = ArgumentParser(prog="stapo", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show the traceback of configuration errors too "
                        "(or STAPO_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(SUBCOMMANDS) + "}")
    name = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    for cmd, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(cmd, help=help_text)
        if cmd == name == "train":
            train_arguments(p)
        elif cmd == name:  # only the subcommand that runs defines (and imports) its arguments
            importlib.import_module(module).add_arguments(p)
    return parser.parse_args(argv)


def precheck(args: argparse.Namespace, held: ExitStack) -> None:
    """Everything checkable before the stage loads: the study, the arguments' values, the output (locked)."""
    if args.command == "train":
        _precheck_train(args, held)


# ------------------------------------------------------------------------------------------------- train


def train_arguments(parser: argparse.ArgumentParser) -> None:
    """``stapo train`` options (stapo.train.trainer.run)."""
    parser.add_argument("--recipe", required=True, help="recipe YAML (configs/paper.yaml, configs/tiny.yaml)")
    parser.add_argument("--model", required=True, help="model KEY in the recipe's models section")
    parser.add_argument("--method", required=True, help="method KEY in the recipe's methods section")
    parser.add_argument("--out", required=True, help="run directory (metrics.jsonl, checkpoint-N/, final/)")
    parser.add_argument("--max-steps", type=int, default=None, help="override train.max_steps (rollout steps)")
    parser.add_argument("--seed", type=int, default=None, help="override train.seed")
    parser.add_argument("--restart", action="store_true",
                        default=os.environ.get("STAPO_RESTART", "0") not in ("", "0"),
                        help="the run directory was started with another config: move that run aside "
                             "(DIR/superseded-<time>/) and start afresh, instead of refusing (or STAPO_RESTART=1, "
                             "e.g. for the jobs of a Snakemake run)")


def world_size() -> int:
    """Processes of this launch, from the launcher's environment (accelerate / torchrun set WORLD_SIZE)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def is_rank_zero() -> bool:
    return int(os.environ.get("RANK", "0") or 0) == 0


def _out_error(out: Path, err: OSError) -> str:
    """``--out`` that cannot be created: a name too long, a read-only or virtual file system (/proc) ..."""
    return "--out: " + (str(err) if err.strerror is None else f"cannot create {out} ({err.strerror})")


def _precheck_train(args: argparse.Namespace, held: ExitStack) -> None:
    """The study (every section and cross-section rule), this run's plan and TRL batch split, ``--out``; then
    rank 0 creates and locks the run directory. No torch."""
    recipe = study.read(args.recipe, required=study.TRAIN_SECTIONS)
    plan = recipe.plan(args.model, args.method, max_steps=args.max_steps, seed=args.seed)
    try:
        study.accumulation(plan.settings, world_size())
    except ValueError as err:
        raise study.StudyError(f"{args.recipe}: {err}") from None
    if "path" in plan.settings.dataset:  # every row checked now, not after the model has loaded (seconds later)
        from stapo.tasks.problems import DatasetError, read_rows

        try:
            read_rows(plan.settings.dataset["path"])
        except DatasetError as err:
            raise study.StudyError(f"{args.recipe}: train.dataset.path: {err}") from None
    out = Path(args.out)
    try:
        check_creatable_dir(out)
    except OSError as err:
        raise UserError(_out_error(out, err)) from None
    check_train_needs(args, recipe, plan)  # before the run directory or its lock exists
    if is_rank_zero():
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise UserError(_out_error(out, err)) from None
        from stapo.core.lock import run_lock

        # a run directory holds no symbolic links: any of its files, planted as one, would redirect a write
        refuse_links(sorted(out.iterdir()))
        held.enter_context(run_lock(out))


MINIATURE = "stapo train --recipe configs/tiny.yaml --model smollm2-135m --method stapo --out runs/smollm2-135m/stapo"


def check_train_needs(args: argparse.Namespace, recipe, plan) -> None:
    """What the run needs from this machine, before the run directory (and its lock) exists and before torch or
    TRL load: vLLM for ``train.use_vllm``, a GPU for ``models.<key>.gpus`` > 0 when launched as one process, the
    model itself (a hub id offline
    must be in the local Hugging Face cache; a bundled model needs its package). One line each, with the fix."""
    import importlib.util

    from stapo import models

    where = f"{args.recipe}: models.{args.model}"
    if plan.settings.use_vllm and importlib.util.find_spec("vllm") is None:
        raise UserError(f"{args.recipe}: train.use_vllm: true needs vLLM, which is not installed here: install the "
                        "GPU stack (conda env create -f environment.yml), or set train.use_vllm: false; "
                        f"the CPU miniature: {MINIATURE}")
    gpus = recipe.models[args.model].gpus
    # one process of a GPU model on a machine without one is the mistake this catches; a multi-process launch
    # (accelerate launch, torchrun: WORLD_SIZE > 1) chose its devices itself, CPU ranks included (gloo; the tests')
    if gpus > 0 and world_size() == 1 and not _torch_sees_a_gpu():
        raise UserError(f"{where}.gpus = {gpus}, but this machine has no GPU (torch sees none): run it on a GPU "
                        f"machine (README, Install on a GPU machine), or the CPU miniature: {MINIATURE}")
    try:
        models.check_available(plan.model_spec)
    except (OSError, ValueError) as err:
        raise UserError(f"{where}.spec: {err}") from None


def _torch_sees_a_gpu() -> bool:
    import torch  # only for a model that asks for GPUs: seconds, not TRL's tens of seconds

    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main())
