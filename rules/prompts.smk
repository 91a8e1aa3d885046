# Prompt sets given as a Hugging Face `datasets` source (datasets.D.source): converted once into
# results/D/prompts.jsonl, which every later rule reads like any other prompts file.


rule import_prompts:
    input:
        source=lambda wc: source_config(wc.dataset)["path"],
    output:
        path_of("imported_prompts"),
    log:
        "logs/import_prompts/{dataset}.log",
    benchmark:
        "benchmarks/import_prompts/{dataset}.tsv"
    conda:
        "../envs/budgetgen.yaml"
    params:
        format=lambda wc: source_config(wc.dataset).get("format"),
        split=lambda wc: source_config(wc.dataset)["split"],
        columns=lambda wc: json.dumps(source_config(wc.dataset)["columns"], sort_keys=True),
        on_bad_line=lambda wc: generation_setting(wc.dataset, "on_bad_line"),
    script:
        "../scripts/import_prompts.py"
