# Generation up to the token budget. One job per dataset; resumes from the journal.
# Content-affecting settings are params (changing them reruns, i.e. resumes, the job); the job builds
# all its settings from the config (budgetgen.settings), so operational ones (URL, timeouts,
# concurrency) never rerun anything.


rule inference:
    input:
        prompts=lambda wc: prompts_path(wc.dataset),
        # ordering only: the status exists before any journal; ancient() so a rewritten status
        # never reruns inference by its newer mtime
        status=ancient(path_of("status")),
        # generation.dedup_across_datasets: the earlier datasets' prompts (imported first)
        earlier=earlier_prompts,
    output:
        done=path_of("done"),
    log:
        # this run's lines (Snakemake empties a declared log before each job)
        "logs/inference/{dataset}.last.log",
    benchmark:
        "benchmarks/inference/{dataset}.tsv"
    conda:
        "../envs/budgetgen.yaml"
    # an HTTP client waits on the server: it takes no --cores, so every dataset's job runs at once
    # under any --cores (the server's queue fills the slots a dataset's drain leaves idle); 1 with
    # server.launch (the job starts a server of its own)
    threads: inference_threads()
    # what a cluster job asks for follows the server mode (budgetgen.cluster): an HTTP client of
    # server.base_url one CPU and no GPU; a job that launches its server what that server needs
    resources:
        **inference_resources(),
        # in-flight requests; cap the total over concurrent jobs with --resources server_slots=N
        server_slots=lambda wc: generation_setting(wc.dataset, "concurrency"),
    params:
        # the one rerun trigger: the content settings (budgetgen.identity.CONTENT_GENERATION_KEYS), the
        # model, on_bad_line; the job reads every setting from the config, its files from the rule
        rerun=lambda wc: rerun_trigger(wc.dataset, "inference"),
        # every run's lines, appended after a separator: a killed run's lines are kept
        log_history=lambda wc: paths(wc.dataset).inference_log,
    message:
        "inference {wildcards.dataset}: generating up to its token budget (resumes from its journal)"
    script:
        "../scripts/run_inference.py"
