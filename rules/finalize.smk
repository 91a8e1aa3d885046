# The journal's records of the generation identities that count, deduplicated by id, as the final
# raw_responses.jsonl (appears atomically).


rule finalize:
    input:
        raw_responses_input,
    output:
        raw_responses=path_of("raw_responses"),
    log:
        "logs/finalize/{dataset}.log",
    benchmark:
        "benchmarks/finalize/{dataset}.tsv"
    # seconds of work: on the submitting host under a cluster executor (budgetgen.cluster.LOCAL_STEPS)
    localrule: True
    conda:
        "../envs/budgetgen.yaml"
    params:
        # the one rerun trigger: which records belong in it (the generation identity now,
        # on_settings_change); the job reads its settings from the config, its files from the rule
        rerun=lambda wc: rerun_trigger(wc.dataset, "finalize"),
    script:
        "../scripts/finalize.py"
