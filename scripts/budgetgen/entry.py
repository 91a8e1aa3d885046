"""How an entry point runs: from the command line (run_main: a UserError is its one line `error: ...`, exit
2) or from a Snakemake `script:` directive (entry_point: the rule's files as argv, its log as stdout and
stderr, a failed job's one-line cause recorded for the run's last lines, budgetgen.failures)."""

from __future__ import annotations

import errno
import sys
from typing import TYPE_CHECKING

from . import failures
from .errors import UserError
from .failures import note_cause

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any, NoReturn, TextIO

    from snakemake.iocontainers import Snakemake


def run_main(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> NoReturn:
    """Run an entry point's main(); turn UserError into `error: ...` on stderr and exit 2."""
    try:
        rc = main(argv)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        note_cause(exc)
        sys.exit(exc.exit_code)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):  # a full disk is the user's to fix, not a bug
            note_cause(f"{type(exc).__name__}: {exc}")
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        note_cause(f"{where}no space left on device ({exc}); free space and rerun")
        print(f"error: {where}no space left on device ({exc}); free space and rerun", file=sys.stderr, flush=True)
        sys.exit(UserError.exit_code)
    except Exception as exc:
        note_cause(f"{type(exc).__name__}: {exc} (a bug: the traceback is in the log)")
        raise
    sys.exit(rc or 0)


def _run_recording_failure(smk, run):
    """Run `run()` as a Snakemake job: clear the job's failure record, and write one if it fails."""
    wildcards = list(smk.wildcards)
    failures.clear(smk.rule, wildcards)
    try:
        run()
    except BaseException as exc:
        code = exc.code if isinstance(exc, SystemExit) else 1
        if code not in (0, None):
            cause = failures.noted_cause() or (
                "interrupted" if isinstance(exc, KeyboardInterrupt) else f"exit status {code}")
            try:
                failures.record(smk.rule, wildcards, cause, smk.log[0] if smk.log else None)
            except OSError:
                pass
        raise


class _Tee:
    """A text stream writing to several files (each line-buffered)."""

    def __init__(self, *files):
        self.files = files

    def write(self, text):
        for f in self.files:
            f.write(text)
        return len(text)

    def flush(self):
        for f in self.files:
            f.flush()

    def fileno(self):
        return self.files[0].fileno()


_TERMINAL = None


def terminal() -> TextIO | None:
    """The stream of the run's terminal while stdout/stderr go to a rule's log (entry_point under
    Snakemake), else None (run from the command line, the log lines are on the terminal already)."""
    return _TERMINAL


def entry_point(main: Callable[..., int | None], argv_from_snakemake: Callable[[Snakemake], Iterable[object]],
                namespace: dict[str, Any], config_from_snakemake: bool = False) -> None:
    """Run an entry point from the command line or from a Snakemake `script:` directive.

    Under Snakemake the rule's input/output/params/config become explicit argv (built by
    `argv_from_snakemake(snakemake)`), and stdout/stderr go to the rule's log file, so the
    same --help'ed command line is what every rule runs.

    Snakemake deletes a rule's declared log before each job. A rule whose history matters (the
    inference job: a killed run's lines explain its resume) also names `params.log_history`: every
    run appends to that file too, after a separator line, so no run's lines are lost.

    config_from_snakemake: main takes `config=` (the config Snakemake loaded and validated, its
    --config overrides included) instead of reading the --config file named in argv.

    A job that fails leaves its one-line cause for the run's last lines (budgetgen.failures).

    The job's own stderr before the redirection (the terminal of the run; a cluster job's Snakemake
    log) stays reachable as `terminal()`, for the few lines meant for whoever watches the run.
    """
    smk = namespace.get("snakemake")
    if smk is None:
        return run_main(main)
    if smk.log:
        import os
        import time

        global _TERMINAL
        _TERMINAL = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
        log = open(smk.log[0], "a", buffering=1, encoding="utf-8")
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.stdout = sys.stderr = log
        history = getattr(smk.params, "log_history", None)
        if history:
            os.makedirs(os.path.dirname(history) or ".", exist_ok=True)
            hist = open(history, "a", buffering=1, encoding="utf-8")
            hist.write(f"===== {smk.rule} run started {time.strftime('%Y-%m-%d %H:%M:%S')} (pid {os.getpid()}; "
                       f"this run alone: {smk.log[0]}) =====\n")
            sys.stdout = sys.stderr = _Tee(log, hist)
    argv = [str(a) for a in argv_from_snakemake(smk)]
    if config_from_snakemake:  # main(argv, config=...) gets the config Snakemake validated
        return _run_recording_failure(smk, lambda: run_main(lambda args: main(args, config=smk.config), argv))
    return _run_recording_failure(smk, lambda: run_main(main, argv))
