#!/usr/bin/env python3
"""Watch a budgetgen run: per dataset a progress bar (tokens of the budget, or generations of a dataset
being exhausted), its state (fresh/partial/met/exhausted/refused), tok/s and req/s over the last minute,
the ETA and the errors, and a total line for the whole run.

    python scripts/watch.py [-d WORKDIR] [--config FILE]            # refreshes every --interval; Ctrl-C to leave
    python scripts/watch.py -d WORKDIR --once                       # one table, then exit
    python scripts/watch.py -d WORKDIR --once --tsv                 # one machine-readable table

WORKDIR is the run's working directory, as snakemake's -d: the folder holding results/ and logs/
(default: the current one). The config is WORKDIR/config.yaml (or WORKDIR/config/config.yaml) unless
--config names it: the file given to snakemake with --configfile, read as snakemake reads it (relative to
the current folder, not to WORKDIR, unless absolute).

On a terminal the table is drawn with colours and refreshes in place. Anywhere else (a pipe, a file,
a script, a CI log) it is plain text: --once prints it once; without --once a new table is appended
every --interval seconds (with the time in its title), never an escape sequence.

Read only (budgetgen.watch): it reads the journals and status files, takes no lock and writes nothing,
so it runs beside `snakemake` while a run holds its lock, from another shell or a login node on the
shared filesystem. A journal's torn tail, or a file replaced under it, is read as it comes.
"""

import argparse
import os
import signal
import sys
import time

from budgetgen.configfile import load_config
from budgetgen.entry import run_main
from budgetgen.errors import UserError
from budgetgen.watch import Watcher, format_plain, format_tsv, render

DEFAULT_CONFIGS = ("config.yaml", os.path.join("config", "config.yaml"))  # as snakemake -d finds them


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--directory", "-d", default=".", metavar="DIR",
                    help="the run's working directory, as snakemake's -d: the folder holding config.yaml, "
                         "results/ and logs/ (default: the current one)")
    ap.add_argument("--config", default=None, metavar="FILE",
                    help="the run's config file (the one given to snakemake with --configfile), relative to the "
                         "current folder as snakemake reads it, unless absolute "
                         f"(default: {' or '.join(DEFAULT_CONFIGS)} in DIR)")
    ap.add_argument("--once", action="store_true",
                    help="print one table and exit (for scripts and CI; plain text unless stdout is a terminal)")
    ap.add_argument("--tsv", action="store_true", help="tab-separated values instead of the table (with --once)")
    ap.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (default %(default)s)")
    a = ap.parse_args(argv)
    if a.interval <= 0:
        ap.error("--interval must be positive")
    if a.tsv and not a.once:
        ap.error("--tsv needs --once")
    return a


def find_config(directory, config):
    """The config file's absolute path: `config` as snakemake reads --configfile (relative to the current
    folder), else the default names in `directory` (as snakemake -d finds them); one line naming the paths
    tried when there is none."""
    tried = ([os.path.abspath(config)] if config
             else [os.path.abspath(os.path.join(directory, c)) for c in DEFAULT_CONFIGS])
    for path in tried:
        if os.path.isfile(path):
            return path
    hint = ""
    inside = os.path.abspath(os.path.join(directory, config)) if config and not os.path.isabs(config) else None
    if inside and os.path.isfile(inside) and inside not in tried:
        hint = f"; {inside} exists in -d, but snakemake reads --configfile from the current folder: give that path"
    what = f"--config {config}: no such file" if config else f"no config file in {os.path.abspath(directory)}"
    raise UserError(f"{what} (tried {', '.join(tried)}){hint}: give the run's working directory with -d DIR, "
                    "or its config with --config FILE (the one given to snakemake with --configfile)")


def main(argv=None):
    a = parse_args(argv)
    # Ctrl-C ends the view (exit 0), also when started with SIGINT ignored (a shell's background job, a test
    # runner's worker process): an ignored SIGINT is inherited, and Python then installs no handler of its own
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if not os.path.isdir(a.directory):
        raise UserError(f"--directory {a.directory}: no such folder")
    config = load_config(find_config(a.directory, a.config))
    os.chdir(a.directory)  # the workflow's paths are relative to its working directory
    watcher = Watcher(config)
    title = f"budgetgen {os.getcwd()}"
    terminal = sys.stdout.isatty()
    try:
        if a.once:
            views = watcher.views()
            if a.tsv:
                sys.stdout.write(format_tsv(views))
            elif terminal:
                from rich.console import Console

                Console().print(render(views, title))
            else:
                sys.stdout.write(format_plain(views, title))
            sys.stdout.flush()
            return 0
        if not terminal:  # a pipe, a file, a CI log: a plain table appended every interval
            while True:
                sys.stdout.write(format_plain(watcher.views(), f"{title}  {time.strftime('%H:%M:%S')}") + "\n")
                sys.stdout.flush()
                time.sleep(a.interval)
        from rich.live import Live

        with Live(render(watcher.views(), title), auto_refresh=False, screen=False) as live:
            while True:
                time.sleep(a.interval)
                live.update(render(watcher.views(), f"{title}  {time.strftime('%H:%M:%S')}"), refresh=True)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:  # `watch.py | head`: the reader is gone, nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    run_main(main)
