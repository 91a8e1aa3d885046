# Checkpoint: the budget status of each dataset, read from its journal.
# No file inputs and no budget param: once written it never needs to rerun, which keeps
# `snakemake -n` exact. The count can be stale but only ever too LOW (journals only grow), so
# a stale status can schedule an inference job that ends at once, never skip unfinished work.
# "met" is decided against the config's budget at DAG time (rules/common.smk), of the journal records
# whose generation identity counts (budgetgen.identity).


checkpoint budget_status:
    input:
        imported_prompts,
        # generation.dedup_across_datasets: the earlier datasets' prompts (imported first)
        earlier_prompts,
    output:
        status=path_of("status"),
    log:
        "logs/budget_status/{dataset}.log",
    benchmark:
        "benchmarks/budget_status/{dataset}.tsv"
    priority: 100
    # seconds of work on the head node: not worth a cluster job (and its queue wait)
    localrule: True
    conda:
        "../envs/budgetgen.yaml"
    # no params: the job reads its settings from the config (budgetgen.settings); the status records
    # the generation identity it counted under, and budgetgen.state trusts it under that one only
    script:
        "../scripts/budget_status.py"
