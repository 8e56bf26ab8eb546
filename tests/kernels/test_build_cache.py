"""The cache of mxmp's operator library (mxmp/_src/kernels/build.py) with a stand-in compiler:
a shell script that answers ``--version``/``-dumpmachine``/``-###`` from its environment, logs
each compilation to a file and writes a small file as the library (or fails, or sleeps). The
build module is loaded from its file (it needs only the standard library), so that the
processes of the concurrency tests start in milliseconds without MXNet.

Pinned: the key covers the compiler, the target ``-march=native`` resolves to and the
lib_api patch; ``$CXX``
with a launcher is run as given; the library is mode 0644 whatever the umask; one compilation
for many processes; a killed build's temporary files are removed by the next build; a failure
is remembered with its reason until an input of the key changes, and said once in a warning;
an unwritable or unloadable shared cache falls back to a private one.
"""
import importlib.util
import logging
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.join(HERE, '..', '..', 'mxmp', '_src', 'kernels', 'build.py')

FAKE_CC = textwrap.dedent('''\
    #!/bin/sh
    for a in "$@"; do
      case "$a" in
        --version) echo "fakecc ${FAKE_VERSION:-1.0}"; exit 0;;
        -dumpmachine) echo "x86_64-linux-gnu"; exit 0;;
        -###) echo "cc1plus -march=${FAKE_TARGET:-znver4} -o /tmp/cc$$.s" >&2; exit 0;;
      esac
    done
    echo "compile $$" >> "$FAKE_LOG"
    sleep "${FAKE_SLEEP:-0}"
    if [ -n "$FAKE_FAIL" ]; then echo "error: boom in line 1" >&2; exit 1; fi
    out=""; prev=""
    for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
    printf 'fake library' > "$out"
''')

LAUNCHER = textwrap.dedent('''\
    #!/bin/sh
    echo "launch $*" >> "$LAUNCH_LOG"
    exec "$@"
''')


def _script(path, text):
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def env(tmp_path, monkeypatch):
    """The stand-in compiler as $CXX, a temp shared cache, a temp private one (TMPDIR)."""
    cc = _script(tmp_path / 'fakecc', FAKE_CC)
    values = {'CXX': cc, 'FAKE_LOG': str(tmp_path / 'compiles.log'),
              'MXMP_KERNEL_CACHE': str(tmp_path / 'cache'), 'TMPDIR': str(tmp_path / 'tmp')}
    os.makedirs(values['TMPDIR'])
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    for k in ('FAKE_FAIL', 'FAKE_SLEEP', 'FAKE_VERSION', 'FAKE_TARGET', 'CXXFLAGS'):
        monkeypatch.delenv(k, raising=False)
    return values


@pytest.fixture
def build(env):
    """A fresh copy of the build module (its caches empty), reading ``env``."""
    spec = importlib.util.spec_from_file_location('mxmp_build_under_test', BUILD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import tempfile
    tempfile.tempdir = None   # TMPDIR is read again
    yield module
    tempfile.tempdir = None


def _compiles(env):
    try:
        with open(env['FAKE_LOG']) as f:
            return len(f.read().splitlines())
    except FileNotFoundError:
        return 0


def test_key_covers_the_compiler_its_version_and_its_target(build, env, monkeypatch, tmp_path):
    first = build.library_file()
    build._compiler_identity.cache_clear()   # the same compiler again, new temporary names
    assert build.library_file() == first
    monkeypatch.setenv('FAKE_VERSION', '2.0')
    build._compiler_identity.cache_clear()
    other_version = build.library_file()
    monkeypatch.setenv('FAKE_TARGET', 'neoverse-v2')   # what -march=native resolves to
    build._compiler_identity.cache_clear()
    other_target = build.library_file()
    monkeypatch.setenv('CXX', _script(tmp_path / 'othercc', FAKE_CC))
    other_compiler = build.library_file()
    assert len({first, other_version, other_target, other_compiler}) == 4
    assert all(p.startswith(env['MXMP_KERNEL_CACHE']) for p in (first, other_target))


def test_key_covers_the_lib_api_patch(build, env, monkeypatch):
    first = build.library_file()
    monkeypatch.setattr(build, 'LIB_API_PATCH', build.LIB_API_PATCH[:-1])
    assert build.library_file() != first


def test_cxx_with_a_launcher_runs_the_launcher(build, env, monkeypatch, tmp_path):
    launcher = _script(tmp_path / 'launch', LAUNCHER)
    monkeypatch.setenv('LAUNCH_LOG', str(tmp_path / 'launch.log'))
    monkeypatch.setenv('CXX', '%s %s' % (launcher, env['CXX']))
    path = build.ensure_built()
    assert open(path).read() == 'fake library'
    launched = (tmp_path / 'launch.log').read_text().splitlines()
    assert any(line.startswith('launch ' + env['CXX']) and ' -o ' in line for line in launched)
    monkeypatch.setenv('CXX', '/no/such/launcher g++')
    with pytest.raises(RuntimeError, match=r'no C\+\+ compiler.*no/such/launcher'):
        build.ensure_built()


def test_library_is_readable_by_whoever_reads_the_cache(build, env):
    os.makedirs(env['MXMP_KERNEL_CACHE'], mode=0o755)   # a cache others may read
    old = os.umask(0o077)
    try:
        path = build.ensure_built()
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    directory = os.path.dirname(path)
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o755
    assert stat.S_IMODE(os.stat(os.path.join(directory, '.lock')).st_mode) == 0o644


def test_many_processes_compile_once(build, env):
    code = ('import importlib.util, sys; s = importlib.util.spec_from_file_location("b", %r); '
            'm = importlib.util.module_from_spec(s); s.loader.exec_module(m); '
            'print(m.ensure_built())' % BUILD)
    procs = [subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, FAKE_SLEEP='1')) for _ in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-500:] for o in outs]
    assert len({o[0].strip() for o in outs}) == 1
    assert _compiles(env) == 1


def test_a_killed_build_leaves_no_temporary_files(build, env):
    code = ('import importlib.util; s = importlib.util.spec_from_file_location("b", %r); '
            'm = importlib.util.module_from_spec(s); s.loader.exec_module(m); m.ensure_built()'
            % BUILD)
    proc = subprocess.Popen([sys.executable, '-c', code], env=dict(os.environ, FAKE_SLEEP='60'),
                            start_new_session=True, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while _compiles(env) == 0 and time.monotonic() < deadline:   # the compiler runs
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    directory = os.path.dirname(build.library_file())
    assert any(n.startswith('tmp') for n in os.listdir(directory))   # what the kill left
    path = build.ensure_built()
    assert sorted(os.listdir(directory)) == sorted(['.lock', os.path.basename(path)])


def test_a_failure_is_remembered_with_its_reason_until_the_inputs_change(build, env,
                                                                         monkeypatch):
    monkeypatch.setenv('FAKE_FAIL', '1')
    with pytest.raises(RuntimeError, match='boom'):
        build.ensure_built()
    monkeypatch.delenv('FAKE_FAIL')   # the same inputs: not retried, the reason is given
    with pytest.raises(RuntimeError, match='boom.*remembered'):
        build.ensure_built()
    assert _compiles(env) == 1
    monkeypatch.setenv('FAKE_VERSION', '2.0')   # another compiler version: built again
    build._compiler_identity.cache_clear()
    assert open(build.ensure_built()).read() == 'fake library'
    assert _compiles(env) == 2


def test_an_unwritable_or_unloadable_cache_falls_back_to_a_private_one(build, env, monkeypatch,
                                                                      tmp_path):
    (tmp_path / 'a_file').write_text('')
    monkeypatch.setenv('MXMP_KERNEL_CACHE', str(tmp_path / 'a_file' / 'cache'))  # cannot write
    path, reason = build.locate(lambda p: None)
    assert reason is None and path.startswith(env['TMPDIR'])
    assert stat.S_IMODE(os.stat(os.path.dirname(os.path.dirname(path))).st_mode) == 0o700

    monkeypatch.setenv('MXMP_KERNEL_CACHE', str(tmp_path / 'shared'))   # a foreign library
    foreign = build.library_file()
    os.makedirs(os.path.dirname(foreign))
    with open(foreign, 'w') as f:
        f.write('built elsewhere')

    def load(p):
        if open(p).read() != 'fake library':
            raise OSError('%s: invalid ELF header' % p)
    path, reason = build.locate(load)
    assert reason is None and path != foreign and path.startswith(env['TMPDIR'])


def test_the_fallback_is_said_once_with_its_reason(env, tmp_path):
    code = textwrap.dedent('''
        import logging, mxnet as mx, mxmp
        records = []
        handler = logging.Handler()
        handler.emit = records.append
        logging.getLogger('mxmp.kernels').addHandler(handler)
        x = mx.sym.LayerNorm(mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=4), name='ln')
        for _ in range(2):
            ops = {n['op'] for n in __import__('json').loads(
                mxmp.convert_symbol(x, 'bfloat16').tojson())['nodes']}
        print(sorted(ops))
        print([r.getMessage() for r in records if 'not available' in r.getMessage()])
    ''')
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, FAKE_FAIL='1',
                                                PYTHONPATH=os.path.join(HERE, '..', '..')))
    assert proc.returncode == 0, proc.stderr[-2000:]
    ops, said = [eval(line) for line in proc.stdout.strip().splitlines()[-2:]]
    assert 'LayerNorm' in ops and 'mxmp_layer_norm' not in ops
    assert len(said) == 1 and 'boom' in said[0] and "MXNet's own kernels" in said[0]
