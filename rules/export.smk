# Exports for draft-model trainers (not part of `all`): `snakemake --cores 1 export`.
# pretokenized.jsonl: SpecForge `data.prompts_path`, `speculators prepare-data --data`.


rule export_dataset:
    input:
        raw="results/{dataset}/raw_responses.jsonl",
        tokenized="results/{dataset}/tokenized.arrow",
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
    script:
        "../scripts/export_dataset.py"


rule export:
    input:
        expand(rules.export_dataset.output, dataset=DATASETS),
