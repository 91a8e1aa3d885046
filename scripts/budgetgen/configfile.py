"""The workflow's config file read outside Snakemake, for the entry points (`--config FILE --dataset D`)
and tools: validated against schemas/config.schema.yaml with its defaults filled, as the Snakefile does
with the config Snakemake loaded, one line on any problem (budgetgen.configcheck). Imports
budgetgen.configcheck and budgetgen.settings; neither imports this module."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .configcheck import duplicate_key, schema_error
from .errors import UserError

if TYPE_CHECKING:
    import argparse
    from typing import Any

    from snakemake.iocontainers import Namedlist

SCHEMA = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "schemas", "config.schema.yaml")


def load_config(path: str | os.PathLike) -> dict[str, Any]:
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


def add_dataset_arguments(ap: argparse.ArgumentParser) -> None:
    """--config FILE --dataset D [-d DIR] [--path NAME=FILE ...]: how an entry point names its dataset's
    settings, and the files a rule declared for it (settings.DatasetPaths.with_files)."""
    ap.add_argument("--config", required=True, help="the workflow's config file (config.yaml)")
    ap.add_argument("--dataset", required=True, help="a dataset of the config")
    ap.add_argument("--path", action="append", default=[], metavar="NAME=FILE",
                    help="a file of the dataset in another place than settings.DatasetPaths says (a rule passes "
                         "its declared inputs and outputs so), e.g. --path raw_responses=out.jsonl; repeatable")
    ap.add_argument("--directory", "-d", default=None,
                    help="working directory: the config's paths (results/D/..., prompts) are relative to it, as with "
                         "snakemake -d (default: the current directory)")


def declared_files(args: argparse.Namespace) -> dict[str, str]:
    """{name: file} of the --path NAME=FILE arguments."""
    files = {}
    for item in args.path:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise UserError(f"--path {item}: give NAME=FILE")
        files[name] = path
    return files


def snakemake_paths(*named: Namedlist) -> list[str]:
    """The `--path NAME=FILE` argv of a rule's named inputs and outputs (snakemake's Namedlists) that are
    files of a dataset (settings.DatasetPaths' fields): the files the script reads and writes are the
    rule's declared ones."""
    from .paths import DatasetPaths

    fields = set(DatasetPaths.__dataclass_fields__) - {"dataset"}
    argv = []
    for files in named:
        for name, path in files.items():
            if name in fields and isinstance(path, str):
                argv += ["--path", f"{name}={path}"]
    return argv


def dataset_config(args: argparse.Namespace, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The validated config for args (add_dataset_arguments), or `config` as Snakemake hands it over;
    changes to args.directory; one line if args.dataset is not one of its datasets."""
    config = config if config is not None else load_config(os.path.abspath(args.config))
    if args.directory:
        os.chdir(args.directory)
    if args.dataset not in config["datasets"]:
        raise UserError(f"--dataset {args.dataset}: not a dataset of {args.config} "
                        f"(datasets: {', '.join(sorted(config['datasets']))})")
    return config
