"""Writing files so that a full disk or a read-only directory is one clear error, never a half-written file.

- ``check_writable(directory, what)``: before any work, the directory exists (created if need be) and a file
  can be created in it, else an ``InputError`` naming the directory and the reason;
- ``atomic_write(path, write, needed)``: the file is written to a temporary name beside it and renamed over
  ``path`` only when complete; on any error the temporary file is removed (the previous ``path``, if any, is
  left as it was), and a full disk, an exceeded quota, a read-only file system or a refused permission
  becomes an ``InputError`` naming the file, the bytes it needed (when known) and the space left there.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from sve.errors import InputError

# What the user can fix (space, quota, permissions); any other OSError is raised as it is.
NOT_WRITABLE = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}
PROBE = ".write-probe"


def _reason(err: OSError) -> str:
    name = errno.errorcode.get(err.errno, str(err.errno))
    return f"{NOT_WRITABLE.get(err.errno) or err.strerror or err} ({name})"


def free_space(path: Path) -> str:
    """The free space of the file system holding ``path`` (its nearest existing ancestor), in words."""
    place = Path(path).absolute()
    while not place.exists() and place != place.parent:
        place = place.parent
    try:
        free = shutil.disk_usage(place).free
    except OSError:
        return f"the free space of the file system holding {place} is unknown"
    return f"the file system holding {place} has {_size(free)} free"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n:,} bytes ({n / scale:.1f} {unit})"
    return f"{n:,} bytes"


def write_error(path: Path, err: OSError, needed: int | None = None, existed: bool = False) -> InputError | None:
    """The ``InputError`` for a write of ``path`` that failed with ``err``, or None when ``err`` is not one the
    user can fix (``NOT_WRITABLE``)."""
    if err.errno not in NOT_WRITABLE:
        return None
    need = f"; it needed about {_size(needed)}" if needed is not None else ""
    left = f"the previous {path.name} is unchanged" if existed else "no partial file was left"
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = "free some space and run again"
    else:
        fix = f"make {path.parent} writable (or write elsewhere) and run again"
    return InputError(f"{path}: not written: {_reason(err)}{need}, and {free_space(path.parent)}; {fix} ({left})")


def atomic_write(path: Path, write: Callable[[BinaryIO], None], needed: int | None = None) -> None:
    """Writes ``path`` through ``write(file)`` (a binary file open on a temporary name in the same directory),
    then renames it over ``path``. See the module docstring for errors; the temporary file never stays."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException as err:  # a full disk, or an interrupt: no temporary file is left behind
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        if isinstance(err, OSError) and (error := write_error(path, err, needed, existed)) is not None:
            raise error from None
        raise


def check_writable(
    directory: Path, what: str = "run directory", hint: str = "hydra.run.dir=<a writable directory>"
) -> None:
    """``directory`` exists (created if need be) and a file can be created and removed in it; else an
    ``InputError`` naming ``what`` and ``directory``, the reason (errno) and ``hint`` (another directory)."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise InputError(f"{what} {directory} is a file, not a directory; pick a directory ({hint})")
    probe = directory / f"{PROBE}.{os.getpid()}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:  # a probe left by a killed process of the same pid: creating files works
        probe.unlink(missing_ok=True)
        return
    except OSError as err:
        raise InputError(
            f"{what} {directory} is not writable: {_reason(err)}; pick another directory ({hint}) or make it writable"
        ) from None
    os.close(fd)
    probe.unlink(missing_ok=True)
