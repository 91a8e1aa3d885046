# Exports for draft-model trainers (not part of `all`): `snakemake --cores 1 export`.


rule export_dataset:
    input:
        raw="results/{dataset}/raw_responses.jsonl",
        tokenized="results/{dataset}/tokenized.arrow",
    output:
        specforge="results/{dataset}/export/specforge.jsonl",
        hf_dataset=directory("results/{dataset}/export/hf_dataset"),
    log:
        "logs/export/{dataset}.log",
    benchmark:
        "benchmarks/export/{dataset}.tsv"
    conda:
        "../envs/budgetgen.yaml"
    script:
        "../scripts/export_dataset.py"


rule export:
    input:
        expand(rules.export_dataset.output, dataset=DATASETS),
