"""Build mxmp's operator library (``mxmp_ops.cc``) and load it into MXNet: :func:`load_library`.

The library is compiled on first use with the system C++ compiler (``$CXX``, which may start
with a launcher such as ``ccache g++``; else ``g++``, else ``c++``) against the installed
wheel's ``mxnet/include/mxnet/lib_api.h`` and ``mxnet/src/lib_api.cc`` (the wheel ships both:
MXNet's way to build an operator library; nothing of MXNet's is copied into mxmp), with
:data:`FLAGS` (``-O3 -march=native``), into a cache directory:
``$MXMP_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/mxmp/kernels``, else ``~/.cache/mxmp/kernels``.

The cache (one directory per key, :func:`library_file`):

- the key hashes the sources, :data:`LIB_API_PATCH`, :data:`FLAGS`, MXNet's version, the
  compiler command, its ``--version`` and the target ``-march=native`` resolves to on this CPU
  (the compiler's own expansion, ``-###``), and the CPU's flags: another compiler, MXNet or
  CPU gets another build;
- one build per key and machine: a file lock (``fcntl.flock``) serialises the processes that
  share the cache (Horovod's ranks), the others wait and load its result;
- the library is written to a temporary file, made readable by anyone who can read the cache
  (mode 0644, whatever the umask and ``mkstemp``'s 0600; the key's directory as readable as the
  cache directory, the lock file 0644) and renamed into place; temporary files a killed build
  left are removed by the next build;
- a compiler failure is remembered with its reason (``failed.txt`` in the key's directory), so
  that other processes do not retry it until an input of the key changes (delete the file to
  retry sooner);
- a cache this process cannot write (read-only, another user's) or whose library does not load
  (foreign, damaged) is replaced by a private one, ``$TMPDIR/mxmp-kernels-<uid>`` (mode 0700).

bfloat16: the compiled copies of the wheel's lib_api files are patched so that library ops take
and return bfloat16 (:data:`LIB_API_PATCH`, :func:`patch_lib_api`: :mod:`.lib_api_patch`).

The build takes ~6 s of CPU once per machine and is said in one log line. Where the library
cannot build or load, mxmp warns once per process naming the reason, and the graphs keep
MXNet's own kernels (the float32 fallback). ``MXMP_KERNELS=mxnet`` in the environment turns the
library off for every policy.
"""
import contextlib
import functools
import glob
import hashlib
import importlib.util
import logging
import os
import shlex
import shutil
import stat
import subprocess
import tempfile

# absolute: tests/kernels/test_build_cache.py loads this file on its own
from mxmp._src.kernels.lib_api_patch import LIB_API_PATCH, patch_lib_api

logger = logging.getLogger('mxmp.kernels')

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'mxmp_ops.cc')
#: The compiler flags (the one place they are set). ``-fopenmp``: the kernels' parallel loops
#: run on libgomp, the OpenMP runtime libmxnet.so links (one thread pool). ``-Wl,-Bsymbolic``:
#: the library's calls bind to its own definitions. libmxnet.so exports lib_api's C++ symbols
#: too (another std::string ABI), and a process that loaded it into the global scope (``import
#: horovod.mxnet``: its ctypes.CDLL(..., RTLD_GLOBAL) brings libmxnet.so with it; Sockeye
#: imports Horovod when installed) would otherwise bind the library's registration to
#: libmxnet's registry: SIGFPE while loading (tests/kernels/test_build.py).
FLAGS = ('-O3', '-march=native', '-fopenmp', '-fno-trapping-math', '-std=c++17', '-shared',
         '-fPIC', '-Wl,-Bsymbolic')
#: The ops the library registers (``mx.library.load`` adds them to mx.nd and mx.sym).
OPS = ('mxmp_layer_norm', 'mxmp_dropout', 'mxmp_softmax', 'mxmp_selfatt_qk',
       'mxmp_selfatt_valatt', 'mxmp_encdec_qk', 'mxmp_encdec_valatt',
       'mxmp_gelu', 'mxmp_batch_dot', 'mxmp_multi_sgd_update')
#: The library's ops without a backward (MXNet registers a ``_backward_`` op for each other
#: one): the optimizer update, which runs outside graphs (mxmp._src.training.updater).
NO_BACKWARD_OPS = ('mxmp_multi_sgd_update',)
#: File names inside a key's directory.
LIBRARY = 'libmxmp_ops.so'
FAILED = 'failed.txt'
_LOCK = '.lock'
_TMP_PREFIX = 'tmp-build-'

__all__ = ['FLAGS', 'OPS', 'NO_BACKWARD_OPS', 'LIB_API_PATCH', 'patch_lib_api', 'cache_dir',
           'private_cache_dir', 'compiler_command', 'library_file', 'ensure_built', 'locate',
           'load_library', 'library_loaded', 'library_ops_in']


def _mxnet_dir():
    """The installed mxnet package's directory, found without importing it."""
    spec = importlib.util.find_spec('mxnet')
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError('mxnet is not installed')
    return list(spec.submodule_search_locations)[0]


def _cpu_flags():
    """The CPU's feature lines of /proc/cpuinfo (x86 ``flags``, Arm ``Features`` and ``CPU
    part``: the generation), else the machine name."""
    try:
        with open('/proc/cpuinfo') as f:
            wanted = ('flags', 'Features', 'CPU implementer', 'CPU part', 'CPU architecture')
            lines = sorted({line.strip() for line in f if line.startswith(wanted)})
        if lines:
            return '\n'.join(lines)
    except OSError:
        pass
    import platform
    return platform.machine()


def compiler_command():
    """list of str: the compiler command (``$CXX`` split as a shell would, so that a launcher
    such as ``ccache g++`` is kept; else ``g++``, else ``c++``), its first word resolved.

    Raises:
        RuntimeError: ``$CXX`` names no program on ``PATH``, or there is no compiler.
    """
    cxx = os.environ.get('CXX', '').strip()
    if cxx:
        words = shlex.split(cxx)
        found = shutil.which(words[0])
        if found is None:
            raise RuntimeError('no C++ compiler: CXX=%r is not on PATH (set $CXX to a compiler, '
                             'or unset it to use g++)' % cxx)
        return [found] + words[1:]
    for name in ('g++', 'c++'):
        if shutil.which(name):
            return [shutil.which(name)]
    raise RuntimeError('no C++ compiler (set $CXX or install g++)')


def _target_options(text):
    """The target options in a compiler's ``-###`` output: gcc's ``-m...`` (``-march=native``
    expanded to the CPU's name and every ISA extension), clang's ``-target-cpu``,
    ``-target-feature`` and ``-triple`` values; not its temporary file names."""
    words = [w.strip('"') for w in text.split()]
    return ' '.join(w for i, w in enumerate(words) if w.startswith('-m') or i and words[i - 1]
                    in ('-target-cpu', '-target-feature', '-triple'))


@functools.lru_cache(maxsize=None)
def _compiler_identity(command):
    """str: the compiler's ``--version``, its target machine and the target options it
    compiles :data:`FLAGS` with on this CPU (``-###`` prints ``-march=native`` resolved) for
    ``command`` (tuple)."""
    out = []
    for extra in (['--version'], ['-dumpmachine'],
                  [*FLAGS, '-###', '-x', 'c++', '-c', os.devnull, '-o', os.devnull]):
        try:
            proc = subprocess.run(list(command) + extra, capture_output=True, text=True,
                                  timeout=60)
        except (OSError, subprocess.SubprocessError) as err:
            raise RuntimeError('%s does not run: %s' % (' '.join(command), err)) from None
        text = proc.stdout + proc.stderr
        out.append('%d %s' % (proc.returncode, _target_options(text) if '-###' in extra
                              else text.strip()))
    return '\n'.join(out)


def cache_dir():
    """str: the shared directory of the built libraries (module docstring)."""
    if os.environ.get('MXMP_KERNEL_CACHE'):
        return os.environ['MXMP_KERNEL_CACHE']
    base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return os.path.join(base, 'mxmp', 'kernels')


def private_cache_dir():
    """str: this user's private cache, ``$TMPDIR/mxmp-kernels-<uid>`` (created mode 0700).

    Raises:
        RuntimeError: the path exists and is not a directory of this user.
    """
    path = os.path.join(tempfile.gettempdir(), 'mxmp-kernels-%d' % os.getuid())
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise RuntimeError('the private kernel cache %s is not a directory of this user' % path)
    return path


def library_file(cache=None):
    """str: the path of the built library for this source, MXNet, compiler and CPU in ``cache``
    (default :func:`cache_dir`; it may not exist).

    Raises:
        RuntimeError: the wheel lacks ``include/mxnet/lib_api.h`` or ``src/lib_api.cc``, or no
            compiler runs.
    """
    root = _mxnet_dir()
    command = compiler_command()
    key = hashlib.sha256()
    for path in (SOURCE, os.path.join(root, 'include', 'mxnet', 'lib_api.h'),
                 os.path.join(root, 'src', 'lib_api.cc'), os.path.join(root, 'libinfo.py')):
        try:
            with open(path, 'rb') as f:
                key.update(f.read())
        except OSError as err:
            raise RuntimeError('the mxnet wheel lacks %s (%s)' % (path, err.strerror)) from None
    for part in (repr(LIB_API_PATCH), ' '.join(FLAGS), ' '.join(command),
                 _compiler_identity(tuple(command)), _cpu_flags()):
        key.update(b'\0' + part.encode())
    return os.path.join(cache or cache_dir(), key.hexdigest()[:20], LIBRARY)


def _make_key_directory(directory):
    """Create a key's ``directory`` as readable as the cache holding it (the umask may be
    stricter than the cache's owner made it)."""
    if os.path.isdir(directory):
        return
    os.makedirs(directory, exist_ok=True)
    cache = stat.S_IMODE(os.stat(os.path.dirname(directory)).st_mode)
    with contextlib.suppress(OSError):
        os.chmod(directory, (cache & 0o755) | 0o700)


@contextlib.contextmanager
def _locked(directory):
    """Hold the build lock of a key's ``directory`` (blocks while another process builds)."""
    import fcntl
    fd = os.open(os.path.join(directory, _LOCK), os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        with contextlib.suppress(OSError):   # others may lock it too (another user's file: as is)
            os.fchmod(fd, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)   # releases the lock


def _failure(directory):
    """The remembered failure of a key's ``directory`` (str), or None."""
    try:
        with open(os.path.join(directory, FAILED)) as f:
            return f.read().strip()
    except OSError:
        return None


def _remember_failure(directory, reason):
    fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, suffix='.txt', dir=directory)
    with os.fdopen(fd, 'w') as f:
        f.write(reason + '\n')
    os.chmod(tmp, 0o644)
    os.replace(tmp, os.path.join(directory, FAILED))


def _compile(command, path):
    """Compile the library to ``path`` through a temporary file in its directory (the caller
    holds the lock).

    Raises:
        RuntimeError: the compiler failed (its last lines in the message; remembered unless a
            signal stopped it).
    """
    directory = os.path.dirname(path)
    for stale in glob.glob(os.path.join(directory, _TMP_PREFIX + '*')):
        os.remove(stale)   # left by a killed build: nobody else builds while we hold the lock
    root = _mxnet_dir()
    fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, suffix='.so', dir=directory)
    os.close(fd)
    logger.warning('mxmp: building its operator library once for this machine (%s)', path)
    try:
        with tempfile.TemporaryDirectory(prefix='mxmp-lib-api-') as patched:
            include, lib_api = patch_lib_api(root, patched)
            cmd = [*command, *FLAGS, '-I' + include, '-I' + os.path.join(root, 'include'),
                   SOURCE, lib_api, '-o', tmp]
            proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            reason = '%s failed (exit %d): %s' % (' '.join(os.path.basename(w) for w in command),
                                                  proc.returncode, ' | '.join(lines))
            if proc.returncode > 0:   # a signal (a killed build) is not the inputs' fault
                _remember_failure(directory, reason)
            raise RuntimeError(reason)
        os.chmod(tmp, 0o644)   # readable by whoever reads the cache (mkstemp makes it 0600)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def ensure_built(cache=None):
    """str: the library's path in ``cache`` (default :func:`cache_dir`), built there first if
    needed: one build per key and machine (module docstring). Does not load it.

    Raises:
        RuntimeError: no compiler or headers; the build failed now, or before (its reason).
        OSError: the cache cannot be written.
    """
    path = library_file(cache)
    directory = os.path.dirname(path)
    if os.path.exists(path):
        return path
    failed = _failure(directory)
    if failed is None:
        _make_key_directory(directory)
        with _locked(directory):
            if os.path.exists(path):   # built by another process while we waited
                return path
            failed = _failure(directory)
            if failed is None:
                _compile(compiler_command(), path)
                return path
    raise RuntimeError('%s (remembered in %s; delete it to retry)'
                     % (failed, os.path.join(directory, FAILED)))


def _load(path):
    """Load the library at ``path`` into MXNet and check its ops are registered."""
    import mxnet as mx
    if not os.access(path, os.R_OK):
        raise OSError('%s is not readable by this user' % path)
    mx.library.load(path, verbose=False)
    missing = [op for op in OPS if op not in mx.operator.get_all_registered_operators()]
    if missing:
        raise RuntimeError('loaded, but MXNet did not register %s' % ', '.join(missing))


_STATE = {}   # 'path' or 'reason': this process's outcome of load_library


def locate(load):
    """``(path, None)`` of a library ``load(path)`` accepted, built first where needed, from
    the shared cache, else (it cannot be written, or its library does not load) from the
    private one; ``(None, reason)`` where neither works. A build failure is not retried in
    the private cache (the same compiler would fail the same way)."""
    reasons = []
    for which in ('shared', 'private'):
        where = '%s cache %s' % (which, cache_dir() if which == 'shared' else 'in $TMPDIR')
        try:
            path = ensure_built(None if which == 'shared' else private_cache_dir())
        except OSError as err:   # cannot write there: the next cache
            reasons.append('%s: %s' % (where, err))
            continue
        except RuntimeError as err:   # the same wherever it is built: no second try
            reasons.append(str(err))
            break
        try:
            load(path)
            return path, None
        except Exception as err:  # pylint: disable=broad-except  (the next cache, or MXNet's)
            reasons.append('%s: %s' % (where, err))
    return None, '; '.join(reasons)


@functools.lru_cache(maxsize=None)
def load_library():
    """Build (first time) and load mxmp's operator library into MXNet, once per process: from
    the shared cache, else (read-only, not loadable) from the private one (:func:`locate`).

    Returns:
        str or None: the library's path, or None where it is off (``MXMP_KERNELS=mxnet``) or
        cannot be built or loaded (then one warning names the reason; MXNet's kernels are used).
    """
    if os.environ.get('MXMP_KERNELS', '').lower() == 'mxnet':
        _STATE['reason'] = 'MXMP_KERNELS=mxnet'
        return None
    path, reason = locate(_load)
    if path is not None:
        _STATE['path'] = path
        return path
    _STATE['reason'] = reason
    logger.warning("mxmp: its operator library is not available (%s); MXNet's own "
                   'kernels run instead (slower: docs/benchmark.md, "Transformers")', reason)
    return None


def library_loaded():
    """bool or None: whether :func:`load_library` loaded the library in this process (None: it
    was not asked yet). Never builds or loads anything."""
    if 'path' in _STATE:
        return True
    return False if 'reason' in _STATE else None


def library_ops_in(graph_json):
    """list of str: the library ops (:data:`OPS`) the graph JSON text ``graph_json`` uses."""
    return [op for op in OPS if '"%s"' % op in graph_json]
