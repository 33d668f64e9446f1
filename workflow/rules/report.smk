# The paper's Table 2 layout (ours next to the paper's numbers) and figures, from every score summary and every
# run's metrics.jsonl. `snakemake --report report.html` collects the table and figures.
# Declared: the figure directory (each png goes into `snakemake --report`) and the figure index. A figure is drawn
# only when it has something to show (the comparison figures: when the study has the methods they compare; the
# per-model ones: when their series are not empty), so single figures are not declared outputs:
# results/figures.md lists each one, or why it was not drawn.


rule report:
    input:
        summaries=all_summaries(),
        runs=all_final_dirs(),
        study=STUDY_FILE,
    output:
        table=report("results/table.md", category="Table", caption="../report/table.rst"),
        tex="results/table.tex",
        intervals="results/intervals.md",
        csv="results/scores.csv",
        examples="results/silenced_examples.md",
        index="results/figures.md",
        cost="results/cost.md",
        figures=report(directory("results/figures"), patterns=["{name}.png"], category="Figures",
                       caption="../report/figure.rst"),
    log:
        "logs/report.log",
    params:
        scores=lambda wildcards, input: "scores",
        runs=lambda wildcards, input: "runs",
        out=lambda wildcards, output: str(Path(output.table).parent),
    threads: 1
    resources:
        gpu=0,
        mem_mb=4000,
        runtime=15,
    conda:
        "../envs/stapo.yaml"
    # set -C (noclobber): the log is created anew (Snakemake removed the old one), never written through a link
    shell:
        "set -C; stapo report --scores {params.scores:q} --runs {params.runs:q} --out {params.out:q}"
        " --config {input.study:q} > {log:q} 2>&1"
