# results/summary.tsv: one row per dataset.


rule summary:
    input:
        raw=expand(path_of("raw_responses"), dataset=DATASETS),
        tokenized=expand(path_of("tokenized"), dataset=DATASETS),
        validation=expand(path_of("validation"), dataset=VALIDATION_DATASETS),
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
        # the one rerun trigger: every dataset's budget lines and policy key; the job reads its settings
        # from the config (budgetgen.settings)
        rerun=json.dumps({ds: [lane_budgets(ds), policy(ds).key()] for ds in DATASETS}, sort_keys=True),
    script:
        "../scripts/summarize.py"
