# Responses -> training rows: prompt ids + completion ids (loss_mask 1 on the completion), Arrow;
# a dataset with a validation split (budgetgen.mixture) also gets its validation rows, beside them.


rule tokenize:
    input:
        "results/{dataset}/raw_responses.jsonl",
    output:
        "results/{dataset}/tokenized.arrow",
    log:
        "logs/tokenize/{dataset}.log",
    benchmark:
        "benchmarks/tokenize/{dataset}.tsv"
    conda:
        "../envs/budgetgen.yaml"
    threads: config["tokenizer"]["processes"]
    params:
        split="train",
        # rerun triggers: the job reads its settings from the config (budgetgen.settings)
        content=lambda wc: settings.config_sha256(config, wc.dataset),
        # the tokenizer's files (vocab, template): editing them in place reruns tokenize too
        tokenizer_sha256=tokenizer_sha256(config["tokenizer"]["path"]),
        chat_template_kwargs=lambda wc: json.dumps(chat_template_kwargs(wc.dataset), sort_keys=True),
    script:
        "../scripts/tokenize_responses.py"


use rule tokenize as tokenize_validation with:
    output:
        "results/{dataset}/validation.arrow",
    log:
        "logs/tokenize/{dataset}.validation.log",
    benchmark:
        "benchmarks/tokenize/{dataset}.validation.tsv"
    params:
        split="validation",
        content=lambda wc: settings.config_sha256(config, wc.dataset),
        tokenizer_sha256=tokenizer_sha256(config["tokenizer"]["path"]),
        chat_template_kwargs=lambda wc: json.dumps(chat_template_kwargs(wc.dataset), sort_keys=True),
