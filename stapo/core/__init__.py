"""Run infrastructure, used by every stage and importing none: atomic writes, one-line errors, documented config
fields, input bounds, JSON-lines reading, locks, checkpoint manifests, the Snakemake driver watch, provenance, the
training launch line and the step unit."""
