# Responses -> training rows: prompt ids + completion ids (loss_mask 1 on the completion), Arrow.


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
        tokenizer=config["tokenizer"]["path"],
        # the tokenizer's files (vocab, template): editing them in place reruns tokenize too
        tokenizer_sha256=tokenizer_sha256(config["tokenizer"]["path"]),
        max_length=config["tokenizer"]["max_length"],
        allow_mixed_settings=config["tokenizer"]["allow_mixed_settings"],
        use_server_token_ids=config["tokenizer"]["use_server_token_ids"],
        trust_remote_code=config["tokenizer"]["trust_remote_code"],
        max_skipped_pct=config["tokenizer"]["max_skipped_pct"],
        reasoning_tags=config["tokenizer"]["reasoning_tags"],
        config_sha256=lambda wc: settings.config_sha256(config, wc.dataset),
        chat_template_kwargs=lambda wc: json.dumps(chat_template_kwargs(wc.dataset), sort_keys=True),
    script:
        "../scripts/tokenize_responses.py"
