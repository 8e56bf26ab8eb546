"""Crash-safe file writes: every file mxmp writes (checkpoints, states, converted models) goes
through :func:`save_atomic`, so a crash leaves the old file or the new one, never a torn one."""
import os
import pathlib
import tempfile

__all__ = ['write_atomic', 'save_atomic']


def write_atomic(fname, data):
    """Write ``data`` (bytes, or str as UTF-8) to ``fname`` atomically (:func:`save_atomic`)."""
    if isinstance(data, str):
        data = data.encode('utf-8')
    save_atomic(fname, lambda tmp: pathlib.Path(tmp).write_bytes(data))


def save_atomic(fname, save):
    """Let ``save(tmp_path)`` write a file, then move it over ``fname`` (str or PathLike)
    atomically and durably: the temporary file (``.<name>.<random>.tmp``, same directory) gets
    the mode ``open()`` would give a new file (``0o666`` less the umask), is fsynced,
    ``os.replace``d over ``fname``, then the directory is fsynced where possible. A
    crash leaves the old ``fname`` or the new one, complete. On an error (what ``save`` raises,
    or OSError) the temporary file is removed and ``fname`` is untouched.
    """
    fname = os.fspath(fname)
    directory = os.path.dirname(os.path.abspath(fname))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix='.%s.' % os.path.basename(fname),
                               suffix='.tmp')
    os.close(fd)
    try:
        save(tmp)
        umask = os.umask(0)   # mkstemp creates 0600; os has no umask getter
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        _fsync(tmp)
        os.replace(tmp, fname)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    try:   # make the rename durable; not possible on every platform/filesystem
        _fsync(directory)
    except OSError:
        pass


def _fsync(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
