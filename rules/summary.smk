# results/summary.tsv: one row per dataset.


rule summary:
    input:
        raw=expand("results/{dataset}/raw_responses.jsonl", dataset=DATASETS),
        tokenized=expand("results/{dataset}/tokenized.arrow", dataset=DATASETS),
    output:
        report("results/summary.tsv", caption="../report/summary.rst", category="Summary"),
    log:
        "logs/summary.log",
    benchmark:
        "benchmarks/summary.tsv"
    # one small table, on the head node under a cluster executor
    localrule: True
    conda:
        "../envs/budgetgen.yaml"
    params:
        datasets=DATASETS,
        budgets=[token_budget(ds) for ds in DATASETS],
        prompts=[prompts_path(ds) for ds in DATASETS],
        errors=[paths(ds).errors for ds in DATASETS],
    script:
        "../scripts/summarize.py"
