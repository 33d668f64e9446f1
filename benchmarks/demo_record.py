"""Record a finished ``make demo`` as the README's demo numbers: its table, intervals, scores, silenced examples and
figures copied into a docs folder with how they were made (RUN.md).

    time make demo                      # in a checkout, on a quiet machine (note the wall time and the load)
    .venv/bin/python benchmarks/demo_record.py --dir . --docs docs/demo --wall-min 13.2 --load "0.9 1.1 1.3"

RUN.md names the commit, the lock the environment was installed from (requirements/cpu.lock's SHA-256), the CPU,
the torch threads, the load, the package versions and the base weights' SHA-256. tests/test_readme.py checks that the
README's demo table is this folder's table.md and that table.md and intervals.md are what ``stapo report`` renders
now from this folder's scores.csv.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a checkout
from stapo.core.provenance import package_versions  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
COPIED = ("table.md", "intervals.md", "scores.csv", "figures.md", "silenced_examples.md")


def _mini_study():
    spec = importlib.util.spec_from_file_location("mini_study", ROOT / "benchmarks" / "mini_study.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cpu_model() -> str | None:
    """The CPU's model name (/proc/cpuinfo), or None where there is none."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True, help="the checkout where make demo finished (its results/ and git)")
    ap.add_argument("--docs", default="docs/demo")
    ap.add_argument("--wall-min", type=float, required=True, help="make demo's wall time, minutes")
    ap.add_argument("--load", required=True, help="the load average when make demo started")
    ap.add_argument("--load-end", help="the load average when it ended")
    ap.add_argument("--command", default="make demo")
    ap.add_argument("--note", help="what else a reader should know of this run (one line, in RUN.md)")
    args = ap.parse_args(argv)
    run_dir = Path(args.dir).resolve()

    def git(*a):
        return subprocess.run(["git", *a], cwd=run_dir, capture_output=True, text=True, check=True).stdout.strip()

    import torch

    from stapo.eval.generation import weights_sha256
    from stapo.models import resolve_model

    provenance = {"command": args.command, "snakemake": "snakemake --cores all --rerun-incomplete --config "
                  "study_file=configs/tiny.yaml -- results/table.md", "commit": git("rev-parse", "HEAD"),
                  "dirty": bool(git("status", "--porcelain", "--", "stapo", "workflow", "configs", "Snakefile")),
                  "started": datetime.now(timezone.utc).strftime("%Y-%m-%d UTC"), "resumed": False,
                  "cores": os.cpu_count(), "cpu": cpu_model(), "torch_threads": torch.get_num_threads(),
                  "load": args.load, "load_end": args.load_end, "wall_min": args.wall_min,
                  "lock_sha256": hashlib.sha256((run_dir / "requirements" / "cpu.lock").read_bytes()).hexdigest(),
                  "packages": package_versions(), "note": args.note,
                  "weights_sha256": weights_sha256(resolve_model("bundled:smollm2-135m-instruct"))}
    _mini_study().write_docs(run_dir, Path(args.docs), provenance, copied=COPIED, what="demo run")
    print(f"demo_record: {args.docs}/ (table, intervals, scores, figures, RUN.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
