# The journal, deduplicated by id, as the final raw_responses.jsonl (appears atomically).


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
        journal=lambda wc: paths(wc.dataset).journal,
    script:
        "../scripts/finalize.py"
