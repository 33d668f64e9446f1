"""The CPU mini-study (``make mini-study``): run the miniature with configs/mini-study.yaml (4 methods × 3 seeds ×
30 rollout steps, SmolLM2-135M-Instruct) in its own Snakemake directory, then copy what it shows into a docs folder
with how it was made.

    python benchmarks/mini_study.py [--dir mini-study-run] [--docs docs/mini-study] [--cores all]

The run directory (runs/, scores/, results/ of the study) is resumable: after a kill, the same command reruns only
what is missing (--rerun-incomplete). The docs folder gets results/table.md, results/seeds.md (the per-seed numbers
and the paired method differences), the figures (png) and RUN.md: the exact command, the commit, whether the work
tree had uncommitted changes, the machine's cores and load, the package versions, the base weights' SHA-256
and the wall time of this invocation (a resumed run
says so, and its wall time covers only the resumed part).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a checkout
from stapo.core.provenance import package_versions  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ("configs/tiny.yaml", "configs/mini-study.yaml")
COPIED = ("table.md", "seeds.md", "scores.csv", "figures.md", "silenced_examples.md")  # figures.md links the last


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def snakemake_command(run_dir: Path, cores: str) -> list[str]:
    bin_dir = Path(sys.executable).parent
    return [str(bin_dir / "snakemake"), "--snakefile", str(ROOT / "Snakefile"), "--directory", str(run_dir),
            "--cores", cores, "--rerun-incomplete", "--configfile", *(str(ROOT / c) for c in CONFIGS),
            "--", "results/table.md"]


def base_weights_sha256() -> dict[str, str]:
    """The SHA-256 of the study's base model weights (the bundled SmolLM2 in the stapo cache, built by the run)."""
    from stapo.eval.generation import weights_sha256
    from stapo.models import resolve_model

    return weights_sha256(resolve_model("bundled:smollm2-135m-instruct"))


def has_earlier_work(run_dir: Path) -> bool:
    """Whether an earlier invocation left training or evaluation outputs in ``run_dir`` (this one resumes it)."""
    return any(any((run_dir / d).glob("*")) for d in ("runs", "scores"))


def write_docs(run_dir: Path, docs: Path, provenance: dict, copied: tuple[str, ...] = COPIED,
               what: str = "mini-study") -> None:
    """Copy the study's ``copied`` results (table, seeds table, scores ...) and figures into ``docs`` and write
    RUN.md (how this ``what`` was made)."""
    results = run_dir / "results"
    docs.mkdir(parents=True, exist_ok=True)
    for name in copied:
        if not (results / name).is_file():
            raise FileNotFoundError(f"{results / name} not found: the study did not write it")
        shutil.copyfile(results / name, docs / name)
    index = docs / "figures.md"  # only the png files are copied: drop the index's pdf links
    index.write_text(re.sub(r" · \[pdf\]\(figures/[^)]*\.pdf\)", "", index.read_text(encoding="utf-8")),
                     encoding="utf-8")
    (docs / "figures").mkdir(exist_ok=True)
    for png in sorted((results / "figures").glob("*.png")):
        shutil.copyfile(png, docs / "figures" / png.name)
    packages, weights = provenance.get("packages"), provenance.get("weights_sha256")
    lines = [f"# How this {what} was made", "",
             f"- command: `{provenance['command']}`",
             f"- snakemake: `{provenance['snakemake']}`",
             f"- commit: `{provenance['commit']}`" + (" (with uncommitted changes)" if provenance["dirty"] else ""),
             f"- started {provenance['started']}, wall time {provenance['wall_min']:.1f} min"
             + (" (resumed: earlier invocations not counted)" if provenance["resumed"] else ""),
             f"- machine: {provenance['cores']} CPU cores"
             + (f" ({provenance['cpu']})" if provenance.get("cpu") else "")
             + f", load average at start {provenance['load']}"
             + (f", at the end {provenance['load_end']}" if provenance.get("load_end") else ""),
             *([f"- environment: requirements/cpu.lock sha256 `{provenance['lock_sha256']}`"]
               if provenance.get("lock_sha256") else []),
             *([f"- note: {provenance['note']}"] if provenance.get("note") else []),
             *([f"- packages: {', '.join(f'{k} {v}' for k, v in packages.items() if v)}"] if packages else []),
             *([f"- base model weights: {', '.join(f'{k} sha256 `{v}`' for k, v in weights.items())}"]
               if weights else []),
             "", "Provenance as JSON:", "", "```json", json.dumps(provenance, indent=2), "```", ""]
    (docs / "RUN.md").write_text("\n".join(lines), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="mini-study-run", help="the study's Snakemake directory (resumable)")
    ap.add_argument("--docs", default="docs/mini-study", help="where its table, seeds table and figures go")
    ap.add_argument("--cores", default="all")
    args = ap.parse_args(argv)
    run_dir, docs = Path(args.dir).resolve(), Path(args.docs)
    cmd = snakemake_command(run_dir, args.cores)
    provenance = {"command": f"make mini-study  # python benchmarks/mini_study.py --dir {args.dir} --docs {docs}",
                  "snakemake": " ".join(["snakemake", *cmd[1:]]).replace(f"{ROOT}{os.sep}", ""),
                  "commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--", "stapo",
                                                                       "workflow", "configs", "Snakefile")),
                  "started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                  "resumed": has_earlier_work(run_dir),
                  "cores": os.cpu_count(), "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
                  "packages": package_versions()}
    start = time.monotonic()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    rc = subprocess.run(cmd, env=env).returncode
    provenance["wall_min"] = (time.monotonic() - start) / 60
    if rc:
        print(f"mini-study: snakemake exited {rc}; rerun the same command to resume", file=sys.stderr)
        return rc
    provenance["weights_sha256"] = base_weights_sha256()
    write_docs(run_dir, docs, provenance)
    print(f"mini-study: {provenance['wall_min']:.1f} min; table, seeds table and figures in {docs}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
