# Generation up to the token budget. One job per dataset; resumes from the journal.
# Content-affecting settings are params (changing them reruns, i.e. resumes, the job); operational
# ones (URL, timeouts) are read from config by the script and never rerun anything.


rule inference:
    input:
        prompts=lambda wc: prompts_path(wc.dataset),
        # ordering only: the status exists before any journal; ancient() so a rewritten status
        # never reruns inference by its newer mtime
        status=ancient("results/{dataset}/budget_status.json"),
    output:
        done="results/{dataset}/inference.done",
    log:
        # this run's lines (Snakemake empties a declared log before each job)
        "logs/inference/{dataset}.last.log",
    benchmark:
        "benchmarks/inference/{dataset}.tsv"
    conda:
        "../envs/budgetgen.yaml"
    resources:
        # in-flight requests; cap the total over concurrent jobs with --resources server_slots=N
        server_slots=lambda wc: gen(wc.dataset, "concurrency"),
    params:
        budget=lambda wc: token_budget(wc.dataset),
        model=config["server"]["model"],
        max_tokens=lambda wc: gen(wc.dataset, "max_tokens"),
        temperature=lambda wc: gen(wc.dataset, "temperature"),
        top_p=lambda wc: gen(wc.dataset, "top_p"),
        seed=lambda wc: gen(wc.dataset, "seed"),
        extra_body=lambda wc: json.dumps(gen(wc.dataset, "extra_body") or {}, sort_keys=True),
        on_bad_line=lambda wc: gen(wc.dataset, "on_bad_line"),
        # every run's lines, appended after a separator: a killed run's lines are kept
        log_history=lambda wc: f"logs/inference/{wc.dataset}.log",
        journal=lambda wc: journal_path(wc.dataset),
        errors=lambda wc: errors_path(wc.dataset),
        # made from the journal by finalize: removed when this job starts (see budgetgen.inference)
        raw_responses=lambda wc: f"results/{wc.dataset}/raw_responses.jsonl",
        # the output of the server this job starts itself (server.launch), if any
        server_log=lambda wc: f"logs/server/{wc.dataset}.log",
    message:
        "inference {wildcards.dataset}: generating up to a budget of {params.budget} completion tokens "
        "(resumes from {params.journal})"
    script:
        "../scripts/run_inference.py"
