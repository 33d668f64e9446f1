# One job per (model, run), a run being a method (one seed) or `<method>/seed<k>` (workflow.seeds). The output is
# runs/<model>/<run>/final, which `stapo train` writes last and
# atomically, so its presence means "done". The run directory itself (checkpoint-N/, metrics.jsonl) is not an
# output: Snakemake never deletes it when a job fails or is killed, and the rerun resumes from the last
# checkpoint (`stapo train` resumes by itself). Run with --rerun-incomplete after a kill.


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
    wildcard_constraints:
        model=alternatives(m for m in MODELS if m not in MULTI_NODE),
        run="|".join(map(re.escape, RUNS)),
    threads: train_cpus
    resources:
        gpu=train_gpus,
        mem_mb=lambda wildcards: model_opt(wildcards.model, "train_mem_mb"),
        runtime=lambda wildcards: model_opt(wildcards.model, "train_runtime"),
    conda:
        "../envs/stapo.yaml"
    # set -C (noclobber): the log is created anew (Snakemake removed the old one), never written through a link
    shell:
        "set -C; {params.launcher} train --recipe {input.recipe:q} --model {wildcards.model:q}"
        " --method {params.method:q}{params.seed} --out {params.run_dir:q} > {log:q} 2>&1{params.prune}"


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
