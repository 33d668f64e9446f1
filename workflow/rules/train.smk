# One job per (model, run), a run being a method (one seed) or `<method>/seed<k>` (workflow.seeds). The output is
# runs/<model>/<run>/final, which `stapo train` writes last and
# atomically, so its presence means "done". The run directory itself (checkpoint-N/, metrics.jsonl) is not an
# output: Snakemake never deletes it when a job fails or is killed, and the rerun resumes from the last
# checkpoint (`stapo train` resumes by itself). Run with --rerun-incomplete after a kill.
#
# Continuation (stapo.train.continuation): under SLURM a job is asked to leave train_leave_before seconds ahead of its
# wall-time limit (SIGUSR1); it saves a checkpoint at its next rollout boundary, exits 75 and requeues itself
# (scontrol requeue: the same job id reruns), as many times as the run needs, without using the profile's retries.
# Evaluation snapshots (snapshot-N/, weights only) move to snapshots/ (rule snapshot), deleted once evaluated. A
# job that leaves keeps its log as logs/train/<model>/<run>.log.<k> (Snakemake empties the log for the next job).


rule train:
    input:
        recipe=ancient(train_recipe),  # content-addressed: its name changes iff the job's config does
    output:
        final=directory("runs/{model}/{run}/final"),
    log:
        "logs/train/{model}/{run}.log",
    params:
        launcher=train_launcher,
        method=run_method,
        seed=run_seed_option,
        run_dir=lambda wildcards, output: str(Path(output.final).parent),
        prune=prune_checkpoints,
        requeue=requeue_on_leave,
    wildcard_constraints:
        model=alternatives(m for m in MODELS if m not in MULTI_NODE),
        run="|".join(map(re.escape, RUNS)),
    threads: train_cpus
    resources:
        gpu=train_gpus,
        mem_mb=lambda wildcards: model_opt(wildcards.model, "train_mem_mb"),
        runtime=lambda wildcards: model_opt(wildcards.model, "train_runtime"),
        slurm_extra=train_slurm_extra,
    conda:
        "../envs/stapo.yaml"
    # set -C (noclobber): the log is created anew (Snakemake removed the old one), never written through a link
    shell:
        "set -C; rm -f {params.run_dir:q}/stapo.continue && {params.launcher} train --recipe {input.recipe:q}"
        " --model {wildcards.model:q} --method {params.method:q}{params.seed} --out {params.run_dir:q} > {log:q} 2>&1"
        "{params.requeue}{params.prune}"


# A model of several nodes (models.<key>.nodes > 1, SLURM only): the same job as one srun step per node
# (stapo.core.launch). `mpi` makes the SLURM job step run the shell line itself instead of wrapping it in `srun -n1`;
# the plugin then asks for --nodes N --ntasks N (one task per node) and the job's --gpus N x gpus.
use rule train as train_nodes with:
    wildcard_constraints:
        model=alternatives(MULTI_NODE),
        run="|".join(map(re.escape, RUNS)),
    resources:
        gpu=train_gpus,
        nodes=train_nodes,
        tasks=train_nodes,
        tasks_per_gpu=0,  # not --ntasks-per-gpu (the plugin's default for a GPU job's `tasks`)
        mpi="srun",
        mem_mb=lambda wildcards: model_opt(wildcards.model, "train_mem_mb"),
        runtime=lambda wildcards: model_opt(wildcards.model, "train_runtime"),
        slurm_extra=train_slurm_extra,


# The evaluation snapshot of checkpoint-N, written by the training job as runs/<model>/<run>/snapshot-N/, moved out of
# the run directory as a declared output: temp() (workflow.keep_snapshots false), so Snakemake deletes each one once
# every evaluation that reads it is scored.
rule snapshot:
    input:
        final="runs/{model}/{run}/final",
    output:
        snapshot_output("snapshots/{model}/{run}/{ckpt}"),
    log:
        "logs/snapshot/{model}/{run}/{ckpt}.log",
    params:
        written=lambda wildcards: f"runs/{wildcards.model}/{wildcards.run}/snapshot-{wildcards.ckpt.split('-')[1]}",
    wildcard_constraints:
        model="|".join(map(re.escape, MODELS)),
        run="|".join(map(re.escape, RUNS)),
        ckpt="checkpoint-[0-9]+",
    localrule: True
    conda:
        "../envs/stapo.yaml"
    shell:
        "set -C; if [ ! -d {params.written:q} ]; then echo 'no evaluation snapshot {params.written}: the run wrote none at"
        " this step (its train.snapshot_steps) or it was already evaluated and deleted; retrain (STAPO_RESTART=1) or"
        " set workflow.keep_snapshots: true' | tee {log:q} >&2; exit 1; fi; mkdir -p \"$(dirname {output:q})\" && mv {params.written:q} {output:q} 2> {log:q}"
