"""User-facing errors: one line, naming the file and line, the config key or the URL."""

import errno
import sys


class UserError(Exception):
    """An error the user can fix; printed as one line without a traceback."""

    exit_code = 2


def run_main(main, argv=None):
    """Run an entry point's main(); turn UserError into `error: ...` on stderr and exit 2."""
    try:
        rc = main(argv)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        sys.exit(exc.exit_code)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):  # a full disk is the user's to fix, not a bug
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {where}no space left on device ({exc}); free space and rerun", file=sys.stderr, flush=True)
        sys.exit(UserError.exit_code)
    sys.exit(rc or 0)


def entry_point(main, argv_from_snakemake, namespace):
    """Run an entry point from the command line or from a Snakemake `script:` directive.

    Under Snakemake the rule's input/output/params/config become explicit argv (built by
    `argv_from_snakemake(snakemake)`), and stdout/stderr go to the rule's log file, so the
    same --help'ed command line is what every rule runs.
    """
    smk = namespace.get("snakemake")
    if smk is None:
        return run_main(main)
    if smk.log:
        log = open(smk.log[0], "a", buffering=1, encoding="utf-8")
        sys.stdout = sys.stderr = log
        import os

        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    return run_main(main, [str(a) for a in argv_from_snakemake(smk)])
