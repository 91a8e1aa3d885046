# Config lookups and short input functions; the decisions live in the package (budgetgen.settings,
# budgetgen.state, budgetgen.configcheck), where unit tests reach them.
import json
import os
import sys

from snakemake.exceptions import WorkflowError
from snakemake.settings.enums import Quietness

sys.path.insert(0, os.path.join(workflow.basedir, "scripts"))
from budgetgen import (  # noqa: E402
    canary,
    cluster,
    configcheck,
    estimate,
    failures,
    settings,
    state,
    status,
)
from budgetgen.errors import UserError  # noqa: E402
from budgetgen.paths import DatasetPaths  # noqa: E402

DATASETS = sorted(config["datasets"])
# datasets with an on-policy validation split (budgetgen.mixture): results/D/validation.arrow
VALIDATION_DATASETS = [ds for ds in DATASETS if settings.validation_share(config, ds) > 0]


wildcard_constraints:
    dataset="[A-Za-z0-9][A-Za-z0-9_.-]*",


def generation_setting(dataset, key):
    return settings.generation_setting(config, dataset, key)


def token_budget(dataset):
    return settings.token_budget(config, dataset)


def lane_budgets(dataset):
    """{lane: budget}: each mixture cell in each split (budgetgen.mixture); one lane without either."""
    return settings.dataset_mixture(config, dataset).budgets()


_AT_DAG_TIME = []  # at_dag_time ran


def at_dag_time():
    """Once, when Snakemake builds the DAG (its execution settings are known then, not at parse time;
    called from the input functions every dataset's jobs evaluate): a dry-run shows Snakemake's job stats
    (the profile's `quiet: progress`, which keeps runs quiet, hides them); under a cluster executor
    (Snakemake runs one with threads) a loopback server.base_url is warned in one line."""
    if _AT_DAG_TIME or not workflow.is_main_process:
        return
    _AT_DAG_TIME.append(True)
    quiet = workflow.output_settings.quiet
    if workflow.dryrun and isinstance(quiet, set):
        quiet.discard(Quietness.PROGRESS)
    execution = workflow.execution_settings  # None when no jobs are run (--report, --lint)
    if execution is not None and execution.use_threads and os.name == "posix":
        print(
            f"budgetgen: on this host, not as cluster jobs: {', '.join(cluster.LOCAL_STEPS)}", file=sys.stderr
        )
        warning = cluster.loopback_warning(config)
        if warning:
            print(warning, file=sys.stderr)


def report_saying_where(create_report):
    """Snakemake's create_report, then one line naming the file it wrote: a relative --report path is
    relative to the working directory (-d), not to the folder snakemake was started in."""

    def create(report_plugin, report_settings, global_report_settings):
        create_report(report_plugin, report_settings, global_report_settings)
        path = getattr(report_settings, "path", None)
        if path is not None:
            print(f"budgetgen: report written to {os.path.abspath(path)}", file=sys.stderr)

    return create


workflow.create_report = report_saying_where(workflow.create_report)


def earlier_prompts(wildcards):
    """generation.dedup_across_datasets: the earlier datasets' prompts files (ancient: they are read,
    and an edit to one is seen by the job's own check, not by mtime)."""
    at_dag_time()
    return [ancient(p) for p in settings.earlier_prompts(config, wildcards.dataset)]


def paths(dataset):
    return DatasetPaths.of(config, dataset)


def path_of(name):
    """A dataset file's pattern, e.g. results/{dataset}/raw_responses.jsonl: written once, in
    budgetgen.paths.DatasetPaths.PATTERNS; a rule names its inputs and outputs by these fields, and
    its script receives them (--path NAME=FILE) instead of finding them itself."""
    return DatasetPaths.PATTERNS[name]


def source_config(dataset):
    """datasets.D.source (a `datasets` source), or None for a plain prompts file."""
    return config["datasets"][dataset].get("source")


def prompts_path(dataset):
    return paths(dataset).prompts


def imported_prompts(wildcards):
    """The imported prompts.jsonl of a `source` dataset (ancient: a re-import reruns nothing by
    mtime alone), so the status checkpoint can read it; nothing for a plain prompts file."""
    if source_config(wildcards.dataset) is None:
        return []
    return [ancient(prompts_path(wildcards.dataset))]


def rerun_trigger(dataset, stage):
    """A rule's one rerun param: what, when it changes, makes the stage's output another one
    (budgetgen.settings.rerun_trigger)."""
    return json.dumps(settings.rerun_trigger(config, dataset, stage), sort_keys=True)


def policy(dataset):
    """The dataset's generation identity now and generation.on_settings_change (budgetgen.identity):
    which journal records count."""
    return settings.settings_policy(config, dataset)


def chat_template_kwargs(dataset):
    return settings.chat_template_kwargs(config, dataset)


def inference_threads():
    return settings.inference_threads(config)


def inference_resources():
    return cluster.inference_resources(config)


def profile_resources():
    """The profile's default-resources and set-resources (Snakemake's parsed values)."""
    rs = workflow.resource_settings
    return rs.default_resources, rs.overwrite_resources


for _check in (  # in order, each only once the ones before it passed (a later one reads what they check)
    lambda: configcheck.config_problem(config, workflow.configfiles),
    lambda: cluster.profile_problem(config, *profile_resources()),
    lambda: configcheck.api_key_warning(config, os.environ),
    lambda: configcheck.identical_samples_warning(config),
    lambda: configcheck.small_lane_warning(config),
):
    _problem = _check()
    if _problem and _problem.startswith("warning:"):
        print(_problem, file=sys.stderr)
    elif _problem:
        raise WorkflowError(_problem)


def forget_earlier_failures():
    """onstart: the failure records left are this run's (budgetgen.failures)."""
    failures.reset()


def say_failures_last():
    """onerror: one line per failed job with its cause and log, as the run's last lines."""
    for line in failures.summary_lines(workflow.execution_settings.keep_going):
        print(line, file=sys.stderr)


def check_tokenizer_before_jobs():
    """Called from the Snakefile's onstart: when jobs are about to run (not at parse time, so
    `snakemake -n` and `--lint` work on a clone whose tokenizer is not built yet), and only if a
    tokenize job is among them."""
    if any(job.rule.name == "tokenize" for job in workflow.dag.needrun_jobs()):
        problem = configcheck.tokenizer_problem(config["tokenizer"]["path"])
        if problem:
            raise WorkflowError(problem)


def dataset_files(dataset):
    p = paths(dataset)
    return state.DatasetFiles(journal=p.journal, done=p.done, status=p.status, prompts=p.prompts)


def raw_responses_input(wildcards):
    """Finalize straight from the journal when the checkpoint says met or exhausted (no inference
    job); otherwise through the inference job's done marker (see budgetgen.state)."""
    at_dag_time()
    ds = wildcards.dataset
    p = paths(ds)
    if os.path.exists(p.done) or not os.path.exists(p.journal):
        # no need to wait for the checkpoint: a dry-run on a fresh tree already lists inference
        return [p.done]
    found = state.read_json(checkpoints.budget_status.get(dataset=ds).output[0])
    if state.finalize_from_journal(dataset_files(ds), lane_budgets(ds), policy(ds).key(), found):
        return [p.journal]
    return [p.done]


REFUSED = {}  # {dataset: its status-table state}: a settings change its jobs would refuse
PENDING = set()  # datasets whose status row says work is left (not met, exhausted or refused)


def canary_before_jobs():
    """Called from the Snakefile's onstart: server.canary asked once per run, before any job, when a job
    of a dataset with work left is among them (budgetgen.canary)."""
    mine = {job.wildcards.get("dataset") for job in workflow.dag.needrun_jobs()}
    if not config["server"].get("canary") or not (mine & PENDING):
        return
    try:
        line = canary.check_before_jobs(config, os.environ)
    except UserError as exc:
        raise WorkflowError(str(exc))
    if line:
        print(f"budgetgen: {line}", file=sys.stderr)


def refuse_before_jobs():
    """Called from the Snakefile's onstart: a settings change a dataset's job would refuse (the status
    table says `refused`) refuses the run before any job starts, so no finished output is removed."""
    mine = {job.wildcards.get("dataset") for job in workflow.dag.needrun_jobs()}
    problem = state.refused_before_jobs({ds: row for ds, row in REFUSED.items() if ds in mine})
    if problem:
        raise WorkflowError(problem)


def print_status_table():
    """Tokens done and left per dataset, at DAG time (so `snakemake -n` shows it too)."""
    if workflow.is_main_process:
        rows, left = [], []
        expected = config["server"].get("expected_tokens_per_s")
        for ds in DATASETS:
            s = settings.InferenceSettings.from_config(config, ds)
            mine = state.status_rows(
                ds, dataset_files(ds), s.mixture.budgets(), s.policy, status.table_counts(s)
            )
            rows += mine
            if mine[0][5].startswith(state.REFUSED):
                REFUSED[ds] = mine[0][5]
            elif not mine[0][5].startswith((state.MET, state.EXHAUSTED)):
                PENDING.add(ds)
            left.append(estimate.remaining(s, mine, expected))
        print(state.format_status_table(rows), file=sys.stderr)
        gpus = estimate.server_gpus(config["server"])
        print(estimate.format_table(left, expected, gpus), file=sys.stderr)
        print(f"budgetgen: {cluster.request_line(config, *profile_resources())}", file=sys.stderr)


print_status_table()
