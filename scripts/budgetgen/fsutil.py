"""Atomic file output: write next to the target, fsync, then rename over it."""

from __future__ import annotations

import errno
import json
import os
import tempfile
from contextlib import contextmanager
from typing import TYPE_CHECKING

from .errors import UserError

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator
    from typing import IO, Any

_UMASK = os.umask(0)
os.umask(_UMASK)


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[str]:
    """Yield a temporary path next to `path`; on success it is fsynced and renamed over `path`,
    so readers see the old file or the whole new one, never a part. On error it is removed."""
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp's 0600 would hide outputs from the rest of a team
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):  # one line, not a traceback
            raise UserError(f"{path}: cannot write ({os.strerror(exc.errno)}); free space and rerun") from None
        raise
    fsync_dir(directory)


@contextmanager
def atomic_output(path: str | os.PathLike, mode: str = "w", encoding: str = "utf-8") -> Iterator[IO[Any]]:
    """Yield an open file; on success its data appears at `path` whole, or not at all."""
    with atomic_path(path) as tmp:
        with open(tmp, mode, **({} if "b" in mode else {"encoding": encoding})) as f:
            yield f


def write_json_atomic(path: str | os.PathLike, obj: object) -> None:
    with atomic_output(path) as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


def fsync_dir(directory: str) -> None:
    """Make a rename durable (a crash after rename must not lose the new name)."""
    try:
        fd = os.open(directory or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_outputs(paths: Iterable[str]) -> list[str]:
    """Remove files and folders (a folder is renamed aside first, so it is gone at once, then deleted);
    returns the paths that existed."""
    import shutil

    removed = []
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            aside = f"{path}.removing.{os.getpid()}"
            os.replace(path, aside)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue
        removed.append(path)
    return removed
