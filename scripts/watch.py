#!/usr/bin/env python3
"""Watch a budgetgen run: per dataset a progress bar (tokens of the budget, or generations of a dataset
being exhausted), its state (fresh/partial/met/exhausted/refused), tok/s and req/s over the last minute,
the ETA and the errors, and a total line for the whole run.

    python scripts/watch.py [-d WORKDIR] [--config FILE]            # refreshes in place; Ctrl-C to leave
    python scripts/watch.py -d WORKDIR --once                       # one table, then exit
    python scripts/watch.py -d WORKDIR --once --tsv                 # one machine-readable table

Read only (budgetgen.watch): it reads the journals and status files, takes no lock and writes nothing,
so it runs beside `snakemake` while a run holds its lock, from another shell or a login node on the
shared filesystem. A journal's torn tail, or a file replaced under it, is read as it comes.
"""

import argparse
import os
import sys
import time

from budgetgen.configfile import load_config
from budgetgen.errors import UserError, run_main
from budgetgen.watch import Watcher, format_tsv, render


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--directory", "-d", default=".", help="the run's working directory (default: the current one)")
    ap.add_argument("--config", default="config.yaml",
                    help="the run's config file, relative to the working directory unless absolute "
                         "(default %(default)s; the file given to snakemake with --configfile)")
    ap.add_argument("--once", action="store_true", help="print one table and exit (for scripts and CI)")
    ap.add_argument("--tsv", action="store_true", help="tab-separated values instead of the table (with --once)")
    ap.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (default %(default)s)")
    a = ap.parse_args(argv)
    if a.interval <= 0:
        ap.error("--interval must be positive")
    if a.tsv and not a.once:
        ap.error("--tsv needs --once")
    return a


def main(argv=None):
    a = parse_args(argv)
    if not os.path.isdir(a.directory):
        raise UserError(f"--directory {a.directory}: no such folder")
    config_path = os.path.abspath(os.path.join(a.directory, a.config))
    config = load_config(config_path)
    os.chdir(a.directory)  # the workflow's paths are relative to its working directory
    watcher = Watcher(config)
    title = f"budgetgen {os.getcwd()}"
    if a.once:
        views = watcher.views()
        if a.tsv:
            sys.stdout.write(format_tsv(views))
        else:
            from rich.console import Console

            console = Console()
            if not console.is_terminal:  # a pipe or a CI log: wide enough for every column
                console = Console(width=max(console.width, 150))
            console.print(render(views, title))
        return 0
    from rich.live import Live

    try:
        with Live(render(watcher.views(), title), auto_refresh=False, screen=False) as live:
            while True:
                time.sleep(a.interval)
                live.update(render(watcher.views(), f"{title}  {time.strftime('%H:%M:%S')}"), refresh=True)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    run_main(main)
