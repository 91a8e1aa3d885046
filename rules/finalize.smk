# The journal's records of the generation identities that count, deduplicated by id, as the final
# raw_responses.jsonl (appears atomically).


rule finalize:
    input:
        raw_responses_input,
    output:
        "results/{dataset}/raw_responses.jsonl",
    log:
        "logs/finalize/{dataset}.log",
    benchmark:
        "benchmarks/finalize/{dataset}.tsv"
    conda:
        "../envs/budgetgen.yaml"
    params:
        # rerun trigger: which records belong in it (the generation identity now, on_settings_change);
        # the job reads its settings from the config (budgetgen.settings)
        identity=lambda wc: json.dumps(policy(wc.dataset).key(), sort_keys=True),
    script:
        "../scripts/finalize.py"
