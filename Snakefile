# STAPO study: train every (model, method), evaluate the chosen checkpoints on every (benchmark, setting),
# write the paper's table and figures.
#   snakemake --cores all results/table.md                                       # full study, configs/paper.yaml
#   snakemake --cores all --config study_file=configs/tiny.yaml results/table.md  # CPU miniature (make demo)
#   snakemake --profile workflow/profiles/slurm results/table.md                  # on a SLURM cluster
from pathlib import Path

from snakemake.utils import min_version

min_version("9.0")


# --config study_file=FILE makes FILE the study (study_file=[FILE,OVERLAY,...]: later files overlay it), read by
# stapo.study's bounded reader before anything else sees it (workflow/rules/common.smk). --configfile FILE still
# works, but Snakemake reads that file itself, unbounded, before this Snakefile runs. Without either, the paper's
# study (found beside this Snakefile, so `-d DIR` works without one).
PAPER_STUDY = str(Path(workflow.basedir) / "configs" / "paper.yaml")


if not workflow.overwrite_configfiles and "study_file" not in config:

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
