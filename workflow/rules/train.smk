# One job per (model, method). The output is runs/<model>/<method>/final, which `stapo train` writes last and
# atomically, so its presence means "done". The run directory itself (checkpoint-N/, metrics.jsonl) is not an
# output: Snakemake never deletes it when a job fails or is killed, and the rerun resumes from the last
# checkpoint (`stapo train` resumes by itself). Run with --rerun-incomplete after a kill.


rule train:
    input:
        recipe=ancient(train_recipe),  # content-addressed: its name changes iff the job's config does
    output:
        final=directory("runs/{model}/{method}/final"),
    log:
        "logs/train/{model}/{method}.log",
    params:
        launcher=train_launcher,
        run_dir=lambda wildcards, output: str(Path(output.final).parent),
    wildcard_constraints:
        model="|".join(map(re.escape, MODELS)),
        method="|".join(map(re.escape, METHODS)),
    threads: train_cpus
    resources:
        gpu=train_gpus,
        mem_mb=lambda wildcards: model_opt(wildcards.model, "train_mem_mb"),
        runtime=lambda wildcards: model_opt(wildcards.model, "train_runtime"),
    conda:
        "../envs/stapo.yaml"
    shell:
        "{params.launcher} train --recipe {input.recipe} --model {wildcards.model}"
        " --method {wildcards.method} --out {params.run_dir} > {log} 2>&1"
