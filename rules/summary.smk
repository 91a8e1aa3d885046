# results/summary.tsv: one row per dataset.


rule summary:
    input:
        raw=expand("results/{dataset}/raw_responses.jsonl", dataset=DATASETS),
        tokenized=expand("results/{dataset}/tokenized.arrow", dataset=DATASETS),
        validation=expand("results/{dataset}/validation.arrow", dataset=VALIDATION_DATASETS),
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
        # rerun triggers: the job reads its settings from the config (budgetgen.settings)
        budgets=[lane_budgets(ds) for ds in DATASETS],
        identities=[json.dumps(policy(ds).key(), sort_keys=True) for ds in DATASETS],
    script:
        "../scripts/summarize.py"
