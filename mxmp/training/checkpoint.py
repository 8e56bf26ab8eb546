"""Checkpoint files: crash-safe writers and the binary states file of :class:`mxmp.Trainer`.

:func:`write_atomic` and :func:`save_atomic` write a file so that a crash leaves either the old
file or the new one, complete; every checkpoint file mxmp writes goes through them.
"""
import os
import tempfile

__all__ = ['write_atomic', 'save_atomic']


def write_atomic(fname, data):
    """Write ``data`` (bytes or str) to ``fname`` atomically.

    A temporary file in the same directory is written, flushed and fsynced, then
    ``os.replace``d over ``fname`` (atomic on POSIX and Windows); a crash leaves either the old
    file or the new one, never a mix. The directory is fsynced afterwards where the platform
    allows it, so the rename survives a power loss. A process killed while writing may leave
    its temporary file (``.<name>.<random>.tmp``) beside ``fname``; ``fname`` itself is intact.

    Args:
        fname (str or os.PathLike): destination path.
        data (bytes or str): the content; str is written as UTF-8.

    Raises:
        OSError: the directory is not writable; the temporary file is removed.
    """
    if isinstance(data, str):
        data = data.encode('utf-8')

    def write(tmp):
        with open(tmp, 'wb') as fout:
            fout.write(data)
    save_atomic(fname, write)


def save_atomic(fname, save):
    """Let ``save(path)`` write a file, then move it over ``fname`` atomically and durably.

    For writers that want a path rather than bytes (``nd.save``, ``Block.save_parameters``,
    ``gluon.Trainer.save_states``): ``save`` writes a temporary file in ``fname``'s directory,
    which is then fsynced, ``os.replace``d over ``fname`` and followed by an fsync of the
    directory (where the platform allows it). A crash at any point leaves either the old
    ``fname`` or the new one, complete (POSIX rename semantics; "Files are hard",
    https://danluu.com/file-consistency/ explains why the two fsyncs are needed).

    Args:
        fname (str or os.PathLike): destination path.
        save (callable): ``save(tmp_path)`` writes the whole file to ``tmp_path``.

    Raises:
        whatever ``save`` raises, or OSError; the temporary file is removed and ``fname`` is
        untouched.
    """
    fname = os.fspath(fname)
    directory = os.path.dirname(os.path.abspath(fname))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix='.%s.' % os.path.basename(fname),
                               suffix='.tmp')
    os.close(fd)
    try:
        save(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, fname)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    try:   # make the rename durable; not possible on every platform/filesystem
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
