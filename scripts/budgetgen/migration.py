"""Journals written before generation identities, migrated once (scripts/migrate_journal.py).

A record of `results/D/journal.jsonl` or `results/D/errors.jsonl` that carries no `"identity"` was
written by a release before generation identities (budgetgen.identity). Every reader refuses such a
record in one line naming this migration (`identity.legacy_line`); nothing reads it any other way.

migrate_dataset() stamps each such record with the identity its params imply (identity.legacy_identity;
a record with a `sample` field was made with the configured samples_per_prompt), in the journal's layout
(`id`, `identity` first, `usage` last: budgetgen.journal.encode_record). Records that carry an identity
are copied byte for byte. Under the journal's lock (never beside a running inference job); each file is
rewritten beside itself, fsynced and renamed over the old one (a kill leaves the old file or the whole
new one, never a part), a torn tail (a crash mid-append) left out as every reader leaves it out. A
second run finds nothing to do and writes nothing. Nothing is regenerated: the identities are those
the records were made under.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from . import journal
from .fsutil import atomic_path
from .identity import legacy_identity

if TYPE_CHECKING:
    from .paths import DatasetPaths


def _stamped(line, where, samples):
    """The line of a record, with its identity when it had none (None: unchanged)."""
    got = journal.parse_line_fast(line)
    if got is not None and got[1] is not None:
        return None
    _, _, rec = journal.parse_line(line, where)
    if isinstance(rec.get("identity"), str) and rec["identity"]:
        return None
    ident = legacy_identity(rec, samples)
    rec["identity"], rec["identity_settings"] = ident.sha, ident.settings
    return journal.encode_record(rec)


def migrate_file(path: str | os.PathLike, samples: int) -> tuple[int, int]:
    """Stamp every record of one append-only file that has no identity; returns (stamped, records). The
    file is replaced only when something changed."""
    path = os.fspath(path)
    if not os.path.exists(path):
        return 0, 0
    stamped = records = 0
    for lineno, line in journal.whole_lines(path):
        records += 1
        stamped += _stamped(line, f"{path}:{lineno}", samples) is not None
    if not stamped:
        return 0, records
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as out:
        for lineno, line in journal.whole_lines(path):
            new = _stamped(line, f"{path}:{lineno}", samples)
            out.write(line if new is None else new)
    return stamped, records


def migrate_dataset(paths: DatasetPaths, samples: int) -> dict[str, tuple[int, int]]:
    """Both files of one dataset (settings.DatasetPaths), under the journal's lock: {path: (stamped,
    records)}. The temporary files a killed migration left beside them are removed first."""
    lock = journal.JournalLock(paths.journal).acquire()
    try:
        for p in (paths.journal, paths.errors):
            directory, name = os.path.split(os.path.abspath(p))
            for left in os.listdir(directory) if os.path.isdir(directory) else ():
                if left.startswith(f".{name}.") and left.endswith(".tmp"):
                    os.unlink(os.path.join(directory, left))
        return {p: migrate_file(p, samples) for p in (paths.journal, paths.errors)}
    finally:
        lock.release()




