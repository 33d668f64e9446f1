# STAPO study: train every (model, method), evaluate the chosen checkpoints on every (benchmark, setting),
# write the paper's table and figures.
#   snakemake --cores all results/table.md                               # full study, configs/paper.yaml
#   snakemake --cores all --configfile configs/tiny.yaml results/table.md  # CPU miniature (make demo)
#   snakemake --profile workflow/profiles/slurm results/table.md          # on a SLURM cluster
from pathlib import Path

from snakemake.utils import min_version

min_version("9.0")


# --configfile FILE makes FILE the study (a second --configfile overlays it); without one, the paper's study
# (found beside this Snakefile, so `-d DIR` works without --configfile).
PAPER_STUDY = str(Path(workflow.basedir) / "configs" / "paper.yaml")


if not workflow.overwrite_configfiles:

    configfile: PAPER_STUDY



include: "workflow/rules/common.smk"
include: "workflow/rules/study.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/eval.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        "results/table.md",
    default_target: True
