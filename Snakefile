# budgetgen: prompts.jsonl -> budgeted responses (journal) -> raw_responses.jsonl -> tokenized.arrow
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "config.yaml"


validate(config, "schemas/config.schema.yaml")


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/prompts.smk"
include: "rules/status.smk"
include: "rules/inference.smk"
include: "rules/finalize.smk"
include: "rules/tokenize.smk"
include: "rules/summary.smk"
include: "rules/report.smk"
include: "rules/export.smk"


rule all:
    default_target: True
    input:
        expand("results/{dataset}/tokenized.arrow", dataset=DATASETS),
        expand("results/{dataset}/budget_status.json", dataset=DATASETS),
        "results/summary.tsv",
        expand(rules.plots.output, dataset=DATASETS),
