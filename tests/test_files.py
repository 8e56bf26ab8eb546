"""mxmp/_src/files.py: every file mxmp writes is replaced whole, with the usual file mode."""
import os
import stat

import pytest

from mxmp._src.files import save_atomic, write_atomic


@pytest.fixture
def umask():
    def set_umask(mask):
        os.umask(mask)
    old = os.umask(0o022)
    os.umask(old)
    yield set_umask
    os.umask(old)


@pytest.mark.parametrize('mask, mode', [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_written_file_gets_the_mode_open_gives_a_new_file(tmp_path, umask, mask, mode):
    umask(mask)
    write_atomic(tmp_path / 'a.json', '{}')
    with open(tmp_path / 'b.json', 'w') as f:   # what plain open() gives, for comparison
        f.write('{}')
    assert stat.S_IMODE(os.stat(tmp_path / 'a.json').st_mode) == mode
    assert stat.S_IMODE(os.stat(tmp_path / 'b.json').st_mode) == mode


def test_a_failed_save_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / 'model.params'
    write_atomic(target, b'old')

    def fail(tmp):
        with open(tmp, 'wb') as f:
            f.write(b'half')
        raise RuntimeError('disk full')
    with pytest.raises(RuntimeError, match='disk full'):
        save_atomic(target, fail)
    assert target.read_bytes() == b'old'
    assert sorted(os.listdir(tmp_path)) == ['model.params']
