"""Writing files so that a reader never sees half of one.

Each file is written under a temporary name in its own directory, flushed
to disk, and renamed over its final name (a rename within a directory is
atomic on POSIX): a reader, or a process killed half-way, sees the old
file or the new one. `write_files` writes all of a set before renaming any,
so a failure while writing leaves every old file byte-identical.
"""

import os
import tempfile

from stageml.errors import OutputError


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _temporary(path: str) -> str:
    directory, name = os.path.split(path)
    fd, temp = tempfile.mkstemp(prefix=f".{name}.", suffix=".partial", dir=directory or ".")
    os.close(fd)
    return temp


def write_files(files: list) -> None:
    """Writes [(path, write)], `write(temporary path)` making each file's
    contents, and renames them into place in the order given."""
    files = [(os.path.abspath(path), write) for path, write in files]
    temps, path = [], files[0][0]
    try:
        for path, write in files:
            if os.path.isdir(path):
                raise IsADirectoryError(21, "it is a directory")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            temps.append(_temporary(path))
            write(temps[-1])
            _fsync(temps[-1])
        for (path, _), temp in zip(files, list(temps)):
            os.replace(temp, path)
            temps.remove(temp)
        for directory in dict.fromkeys(os.path.dirname(p) for p, _ in files):
            _fsync(directory)
    except OSError as e:
        raise OutputError(f"cannot write {path!r} ({e.strerror or e}): choose a writable output path") from None
    finally:
        for temp in temps:  # those not renamed into place
            _remove(temp)


def write_file(path: str, data: bytes | str) -> None:
    """Writes `data` to `path` atomically."""
    def write(temp):
        with open(temp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
    write_files([(path, write)])


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
