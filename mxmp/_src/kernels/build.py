"""Build mxmp's operator library (``mxmp_ops.cc``) and load it into MXNet: :func:`load_library`.

The library is compiled on first use with the system C++ compiler (``$CXX``, else ``g++``,
else ``c++``) against the installed wheel's ``mxnet/include/mxnet/lib_api.h`` and
``mxnet/src/lib_api.cc`` (the wheel ships both: MXNet's way to build an operator library;
nothing of MXNet's is copied into mxmp), with ``-O3 -march=native``, into a cache directory
keyed by the hash of the sources, the flags, the MXNet version and the CPU's flags:
``$MXMP_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/mxmp/kernels``, else ``~/.cache/mxmp/kernels``.
The build takes ~6 s of CPU once per machine and is said in one log line. Where it cannot build
or load (no compiler, no headers in the wheel, a read-only cache, another MXNet), mxmp warns once
and the graphs keep MXNet's own kernels: the float32 fallback. ``MXMP_KERNELS=mxnet`` in the
environment turns the library off for every policy.
"""
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile

logger = logging.getLogger('mxmp.kernels')

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'mxmp_ops.cc')
#: ``-Wl,-Bsymbolic``: the library's calls bind to its own definitions. libmxnet.so exports
#: lib_api's C++ symbols too (another std::string ABI), and a process that loaded it into the
#: global scope (``import horovod.mxnet``: its ctypes.CDLL(..., RTLD_GLOBAL) brings libmxnet.so
#: with it; Sockeye imports Horovod when installed) would otherwise bind the library's
#: registration to libmxnet's registry: SIGFPE while loading (tests/kernels/test_build.py).
FLAGS = ('-O3', '-march=native', '-fopenmp', '-fno-trapping-math', '-std=c++17', '-shared',
         '-fPIC', '-Wl,-Bsymbolic')
#: The ops the library registers (``mx.library.load`` adds them to mx.nd and mx.sym).
OPS = ('mxmp_layer_norm', 'mxmp_dropout', 'mxmp_softmax')


def _mxnet_dir():
    import mxnet
    return os.path.dirname(os.path.abspath(mxnet.__file__))


def _cpu_flags():
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('flags'):
                    return line
    except OSError:
        pass
    import platform
    return platform.processor() + platform.machine()


def _compiler():
    for name in (os.environ.get('CXX'), 'g++', 'c++'):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def cache_dir():
    """str: the directory of the built libraries (module docstring)."""
    if os.environ.get('MXMP_KERNEL_CACHE'):
        return os.environ['MXMP_KERNEL_CACHE']
    base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return os.path.join(base, 'mxmp', 'kernels')


def library_file():
    """str: the path of the built library for this source, MXNet and CPU (it may not exist).

    Raises:
        FileNotFoundError: the wheel lacks ``include/mxnet/lib_api.h`` or ``src/lib_api.cc``.
    """
    import mxnet
    root = _mxnet_dir()
    key = hashlib.sha256()
    for path in (SOURCE, os.path.join(root, 'include', 'mxnet', 'lib_api.h'),
                 os.path.join(root, 'src', 'lib_api.cc')):
        with open(path, 'rb') as f:
            key.update(f.read())
    key.update(' '.join(FLAGS).encode())
    key.update(mxnet.__version__.encode())
    key.update(_cpu_flags().encode())
    return os.path.join(cache_dir(), key.hexdigest()[:20], 'libmxmp_ops.so')


def build(path):
    """Compile the library to ``path`` (atomically: a concurrent build of the same key is
    harmless).

    Raises:
        RuntimeError: no compiler, or the compiler failed (its last lines in the message).
    """
    cxx = _compiler()
    if cxx is None:
        raise RuntimeError('no C++ compiler (set $CXX or install g++)')
    root = _mxnet_dir()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix='.so', dir=os.path.dirname(path))
    os.close(fd)
    cmd = [cxx, *FLAGS, '-I' + os.path.join(root, 'include'), SOURCE,
           os.path.join(root, 'src', 'lib_api.cc'), '-o', tmp]
    logger.warning('mxmp: building its operator library once for this machine (%s)', path)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError('%s failed: %s' % (os.path.basename(cxx),
                                                   ' | '.join(proc.stderr.strip().splitlines()[-3:])))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


@functools.lru_cache(maxsize=None)
def load_library():
    """Build (first time) and load mxmp's operator library into MXNet, once per process.

    Returns:
        str or None: the library's path, or None where it is off (``MXMP_KERNELS=mxnet``) or
        cannot be built or loaded (then one warning says why; MXNet's kernels are used).
    """
    if os.environ.get('MXMP_KERNELS', '').lower() == 'mxnet':
        return None
    try:
        import mxnet as mx
        path = library_file()
        if not os.path.exists(path):
            build(path)
        mx.library.load(path, verbose=False)
        missing = [op for op in OPS if op not in mx.operator.get_all_registered_operators()]
        if missing:
            raise RuntimeError('loaded, but MXNet did not register %s' % ', '.join(missing))
        return path
    except Exception as err:  # any failure means: MXNet's own kernels
        logger.warning("mxmp: its operator library is not available (%s); MXNet's own "
                       'kernels run instead (slower: docs/benchmark.md, "Transformers")', err)
        return None
