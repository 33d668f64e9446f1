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
        model="|".join(map(re.escape, MODELS)),
        run="|".join(map(re.escape, RUNS)),
    threads: train_cpus
    resources:
        gpu=train_gpus,
        mem_mb=lambda wildcards: model_opt(wildcards.model, "train_mem_mb"),
        runtime=lambda wildcards: model_opt(wildcards.model, "train_runtime"),
    conda:
        "../envs/stapo.yaml"
    shell:
        "{params.launcher} train --recipe {input.recipe:q} --model {wildcards.model:q}"
        " --method {params.method:q}{params.seed} --out {params.run_dir:q} > {log:q} 2>&1{params.prune}"
