# Responses -> training rows: prompt ids + completion ids (loss_mask 1 on the completion), Arrow;
# a dataset with a validation split (budgetgen.mixture) also gets its validation rows, beside them.


rule tokenize:
    input:
        raw_responses=path_of("raw_responses"),
    output:
        tokenized=path_of("tokenized"),
    log:
        "logs/tokenize/{dataset}.log",
    benchmark:
        "benchmarks/tokenize/{dataset}.tsv"
    conda:
        "../envs/budgetgen.yaml"
    threads: config["tokenizer"]["processes"]
    params:
        split="train",
        # the one rerun trigger: the content key, the tokenizer's files (an edit in place reruns tokenize),
        # the template switches; the job reads its settings from the config, its files from the rule
        rerun=lambda wc: rerun_trigger(wc.dataset, "tokenize"),
    script:
        "../scripts/tokenize_responses.py"


use rule tokenize as tokenize_validation with:
    output:
        validation=path_of("validation"),
    log:
        "logs/tokenize/{dataset}.validation.log",
    benchmark:
        "benchmarks/tokenize/{dataset}.validation.tsv"
    params:
        split="validation",
        rerun=lambda wc: rerun_trigger(wc.dataset, "tokenize"),
