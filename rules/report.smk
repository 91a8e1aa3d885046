# Report figures per dataset (snakemake --report report.html): drawn from raw_responses.jsonl,
# captioned by report/*.rst, one report category per dataset.


rule plots:
    input:
        raw=path_of("raw_responses"),
        prompts=lambda wc: prompts_path(wc.dataset),
    output:
        budget=report(
            "results/{dataset}/plots/budget.svg",
            caption="../report/budget.rst",
            category="{dataset}",
            labels={"figure": "1 budget"},
        ),
        lengths=report(
            "results/{dataset}/plots/lengths.svg",
            caption="../report/lengths.rst",
            category="{dataset}",
            labels={"figure": "2 completion lengths"},
        ),
        reasoning=report(
            "results/{dataset}/plots/reasoning.svg",
            caption="../report/reasoning.rst",
            category="{dataset}",
            labels={"figure": "3 reasoning vs answer"},
        ),
        errors=report(
            "results/{dataset}/plots/errors.svg",
            caption="../report/errors.rst",
            category="{dataset}",
            labels={"figure": "4 errors"},
        ),
        throughput=report(
            "results/{dataset}/plots/throughput.svg",
            caption="../report/throughput.rst",
            category="{dataset}",
            labels={"figure": "5 throughput"},
        ),
        turns=report(
            "results/{dataset}/plots/turns.svg",
            caption="../report/turns.rst",
            category="{dataset}",
            labels={"figure": "6 turns"},
        ),
        quality=report(
            "results/{dataset}/plots/quality.svg",
            caption="../report/quality.rst",
            category="{dataset}",
            labels={"figure": "7 quality gate"},
        ),
    log:
        "logs/plots/{dataset}.log",
    benchmark:
        "benchmarks/plots/{dataset}.tsv"
    # seconds of work: on the submitting host under a cluster executor (budgetgen.cluster.LOCAL_STEPS)
    localrule: True
    conda:
        "../envs/budgetgen.yaml"
    params:
        budget=lambda wc: token_budget(wc.dataset),
        max_tokens=lambda wc: generation_setting(wc.dataset, "max_tokens"),
        # read, never declared: like the journal it is not an output of any rule
        errors=lambda wc: paths(wc.dataset).errors,
    script:
        "../scripts/plot_dataset.py"
