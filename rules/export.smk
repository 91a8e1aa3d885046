# Exports for draft-model trainers (not part of `all`): `snakemake --cores 1 export`.
# pretokenized.jsonl: SpecForge `data.prompts_path`, `speculators prepare-data --data`; a dataset with
# a validation split gets the same files of its validation rows under export/validation/.


rule export_dataset:
    input:
        raw=path_of("raw_responses"),
        tokenized=path_of("tokenized"),
    output:
        specforge="results/{dataset}/export/specforge.jsonl",
        pretokenized="results/{dataset}/export/pretokenized.jsonl",
        hf_dataset=directory("results/{dataset}/export/hf_dataset"),
    log:
        "logs/export/{dataset}.log",
    benchmark:
        "benchmarks/export/{dataset}.tsv"
    conda:
        "../envs/budgetgen.yaml"
    params:
        split="train",
    script:
        "../scripts/export_dataset.py"


use rule export_dataset as export_validation with:
    input:
        raw=path_of("raw_responses"),
        tokenized=path_of("validation"),
    output:
        specforge="results/{dataset}/export/validation/specforge.jsonl",
        pretokenized="results/{dataset}/export/validation/pretokenized.jsonl",
        hf_dataset=directory("results/{dataset}/export/validation/hf_dataset"),
    log:
        "logs/export/{dataset}.validation.log",
    benchmark:
        "benchmarks/export/{dataset}.validation.tsv"
    params:
        split="validation",


rule export:
    input:
        expand(rules.export_dataset.output, dataset=DATASETS),
        expand(rules.export_validation.output, dataset=VALIDATION_DATASETS),
