# budgetgen: prompts.jsonl -> budgeted responses (journal) -> raw_responses.jsonl -> tokenized.arrow
import os
import sys

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version, validate

min_version("9.0")


# The bundled demo config, unless the user gives their own (--configfile): a user's config file
# stands alone, never merged over the demo's datasets and values (--config still overrides either).
if not workflow.overwrite_configfiles:

    configfile: "config.yaml"


sys.path.insert(0, os.path.join(workflow.basedir, "scripts"))
from budgetgen.configcheck import duplicate_key, schema_error  # noqa: E402

# before validation, one line naming the key: a duplicate key (YAML keeps the last one silently),
# then a schema error
for _problem in [duplicate_key(f) for f in dict.fromkeys(map(str, workflow.configfiles))] + [
    schema_error(config, os.path.join(workflow.basedir, "schemas/config.schema.yaml"))
]:
    if _problem:
        raise WorkflowError(_problem)


validate(config, "schemas/config.schema.yaml")


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/prompts.smk"
include: "rules/status.smk"
include: "rules/inference.smk"
include: "rules/finalize.smk"
include: "rules/tokenize.smk"
include: "rules/summary.smk"
include: "rules/report.smk"
include: "rules/export.smk"


onstart:
    forget_earlier_failures()
    refuse_before_jobs()
    check_tokenizer_before_jobs()
    canary_before_jobs()


onerror:
    say_failures_last()


rule all:
    default_target: True
    input:
        expand(path_of("tokenized"), dataset=DATASETS),
        expand(path_of("validation"), dataset=VALIDATION_DATASETS),
        expand(path_of("status"), dataset=DATASETS),
        "results/summary.tsv",
        expand(rules.plots.output, dataset=DATASETS),
