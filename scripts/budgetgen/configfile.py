"""The workflow's config file read outside Snakemake, for the entry points (`--config FILE --dataset D`)
and tools: validated against schemas/config.schema.yaml with its defaults filled, as the Snakefile does
with the config Snakemake loaded, one line on any problem (budgetgen.configcheck). Imports
budgetgen.configcheck and budgetgen.settings; neither imports this module."""

import os

from .configcheck import duplicate_key, schema_error
from .errors import UserError

SCHEMA = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "schemas", "config.schema.yaml")


def load_config(path):
    """A config file, validated and with the schema's defaults filled in; one line on any problem."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            config = yaml.safe_load(f)
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    problem = duplicate_key(path) or schema_error(config, SCHEMA)
    if problem:
        raise UserError(problem)
    from snakemake.utils import validate

    validate(config, SCHEMA, set_default=True)
    return config


def add_dataset_arguments(ap):
    """--config FILE --dataset D [-d DIR]: how an entry point names its dataset's settings."""
    ap.add_argument("--config", required=True, help="the workflow's config file (config.yaml)")
    ap.add_argument("--dataset", required=True, help="a dataset of the config")
    ap.add_argument("--directory", "-d", default=None,
                    help="working directory: the config's paths (results/D/..., prompts) are relative to it, as with "
                         "snakemake -d (default: the current directory)")


def dataset_config(args, config=None):
    """The validated config for args (add_dataset_arguments), or `config` as Snakemake hands it over;
    changes to args.directory; one line if args.dataset is not one of its datasets."""
    config = config if config is not None else load_config(os.path.abspath(args.config))
    if args.directory:
        os.chdir(args.directory)
    if args.dataset not in config["datasets"]:
        raise UserError(f"--dataset {args.dataset}: not a dataset of {args.config} "
                        f"(datasets: {', '.join(sorted(config['datasets']))})")
    return config
