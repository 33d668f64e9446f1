# One job per (model, run, checkpoint, benchmark, setting), so evaluations run in parallel and a killed one
# reruns alone. A run is a method or `<method>/seed<k>` (workflow.seeds). ckpt is `final`, `checkpoint-<N>` (the
# accuracy-vs-step curve) or `base` (the untrained model, run `base`). The summary is written last by `stapo eval`; the per-sample .jsonl comes with it.


rule evaluate:
    input:
        eval_model_input,
        benchmark_input,
        recipe=ancient(eval_recipe),  # content-addressed: its name changes iff the job's config does
    output:
        samples="scores/{model}/{run}/{ckpt}/{benchmark}/{setting}.jsonl",
        summary="scores/{model}/{run}/{ckpt}/{benchmark}/{setting}.summary.json",
    log:
        "logs/eval/{model}/{run}/{ckpt}/{benchmark}/{setting}.log",
    params:
        model=eval_model_arg,
        options=eval_options,
    wildcard_constraints:
        model="|".join(map(re.escape, MODELS)),
        run="|".join(map(re.escape, [*RUNS, BASE])),
        ckpt=f"final|checkpoint-[0-9]+|{BASE}",
        benchmark="|".join(map(re.escape, STUDY.eval.benchmarks)),
        setting="|".join(map(re.escape, SETTINGS)),
    threads: eval_cpus
    resources:
        gpu=eval_gpus,
        mem_mb=lambda wildcards: model_opt(wildcards.model, "eval_mem_mb"),
        runtime=lambda wildcards: model_opt(wildcards.model, "eval_runtime"),
    conda:
        "../envs/stapo.yaml"
    # set -C (noclobber): the log is created anew (Snakemake removed the old one), never written through a link
    shell:
        "set -C; stapo eval --model {params.model:q} --benchmark {wildcards.benchmark:q} --setting {wildcards.setting:q}"
        " --out {output.samples:q} --recipe {input.recipe:q} {params.options} > {log:q} 2>&1"
