# The config files the jobs read. Written by these rules, never on parse: `snakemake -n` (or a second invocation
# that stops at Snakemake's lock) with another config writes nothing, so it cannot change a planned job's config.


rule recipe:
    output:
        "results/recipes/{digest}.yaml",
    log:
        "logs/recipes/{digest}.log",
    wildcard_constraints:
        digest="[0-9a-f]{16}",
    localrule: True
    run:
        if output[0] not in RECIPES:
            raise ValueError(f"{output[0]}: not a recipe of this study's config")
        atomic_write(output[0], RECIPES[output[0]], inside="results")


rule study_file:
    input:
        ancient(STUDY_RECIPE),
    output:
        STUDY_FILE,
    log:
        "logs/study_file.log",
    localrule: True
    run:
        atomic_write(output[0], Path(input[0]).read_text(encoding="utf-8"))
