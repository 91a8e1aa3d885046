"""User-facing errors: one line, naming the file and line, the config key or the URL. At the ground: it
imports nothing (an entry point turns a UserError into its one line: budgetgen.entry)."""

from __future__ import annotations


class UserError(Exception):
    """An error the user can fix; printed as one line without a traceback."""

    exit_code = 2
