"""The CUDA 11 libraries of the ``nvidia-*-cu11`` pip packages, made visible to mxnet-cu112 1.9.1
(which links them by soname but does not ship them) by preloading them before ``import mxnet``.
Imports neither mxnet nor numpy: it runs first in ``mxmp/__init__.py``. How, and the
``LD_LIBRARY_PATH`` alternative (``python -m mxmp._src.cuda --print-path``): docs/cli.md.
"""
import argparse
import collections
import ctypes
import glob
import importlib.metadata
import os
import site
import sys

CudaLibrary = collections.namedtuple('CudaLibrary', ['soname', 'package', 'subdir'])
CudaLibrary.__doc__ = """A shared library ``soname``, the pip ``package`` that ships it as
``site-packages/nvidia/<subdir>/lib/<soname>``."""

#: ``(library, required)`` in load order, dependencies first. Required: what mxnet-cu112 1.9.1
#: needs (``readelf -d libmxnet.so``: NEEDED). Optional: opened at run time by soname (cuDNN 8's
#: sub-libraries...), loaded when present, never reported missing; shell patterns allowed.
_LOAD_ORDER = (
    (CudaLibrary('libcudart.so.11.0', 'nvidia-cuda-runtime-cu11', 'cuda_runtime'), True),
    (CudaLibrary('libnvToolsExt.so.1', 'nvidia-nvtx-cu11', 'nvtx'), True),
    (CudaLibrary('libcublasLt.so.11', 'nvidia-cublas-cu11', 'cublas'), True),
    (CudaLibrary('libcublas.so.11', 'nvidia-cublas-cu11', 'cublas'), True),
    (CudaLibrary('libnvrtc.so.11.2', 'nvidia-cuda-nvrtc-cu11', 'cuda_nvrtc'), True),
    (CudaLibrary('libnvrtc-builtins.so.11.*', 'nvidia-cuda-nvrtc-cu11', 'cuda_nvrtc'), False),
    (CudaLibrary('libcurand.so.10', 'nvidia-curand-cu11', 'curand'), True),
    (CudaLibrary('libcufft.so.10', 'nvidia-cufft-cu11', 'cufft'), True),
    (CudaLibrary('libcusparse.so.11', 'nvidia-cusparse-cu11', 'cusparse'), False),
    (CudaLibrary('libcusolver.so.11', 'nvidia-cusolver-cu11', 'cusolver'), True),
    (CudaLibrary('libcudnn_ops_infer.so.8', 'nvidia-cudnn-cu11', 'cudnn'), False),
    (CudaLibrary('libcudnn_ops_train.so.8', 'nvidia-cudnn-cu11', 'cudnn'), False),
    (CudaLibrary('libcudnn_cnn_infer.so.8', 'nvidia-cudnn-cu11', 'cudnn'), False),
    (CudaLibrary('libcudnn_cnn_train.so.8', 'nvidia-cudnn-cu11', 'cudnn'), False),
    (CudaLibrary('libcudnn_adv_infer.so.8', 'nvidia-cudnn-cu11', 'cudnn'), False),
    (CudaLibrary('libcudnn_adv_train.so.8', 'nvidia-cudnn-cu11', 'cudnn'), False),
    (CudaLibrary('libcudnn.so.8', 'nvidia-cudnn-cu11', 'cudnn'), True),
    (CudaLibrary('libnccl.so.2', 'nvidia-nccl-cu11', 'nccl'), True),
)
#: The required libraries, in load order.
CUDA_LIBRARIES = tuple(lib for lib, required in _LOAD_ORDER if required)

#: ``1``/``true``/``yes`` forces the preload at ``import mxmp``, ``0``/``false``/``no`` prevents
#: it; unset: preload when a distribution of :data:`CUDA_DISTRIBUTIONS` is installed.
PRELOAD_ENV = 'MXMP_PRELOAD_CUDA'

CUDA_DISTRIBUTIONS = ('mxnet-cu112',)

#: cuDNN 9 also has a ``-cu11`` package; mxnet-cu112 needs cuDNN 8.
_PIN = {'nvidia-cudnn-cu11': 'nvidia-cudnn-cu11<9'}

_LOADED = []  # what preload_cuda_libraries opened with ctypes: paths, or sonames of the system


class CudaLibrariesNotFound(ImportError):
    """Required CUDA libraries are missing (``missing``: list of CudaLibrary) or fail to load
    (``failed``: soname -> loader error); ``searched``: the directories searched."""

    def __init__(self, missing, failed=None, searched=()):
        self.missing = list(missing)
        self.failed = dict(failed or {})
        self.searched = list(searched)
        super().__init__(self._message())

    def _message(self):
        lines = []
        if self.missing:
            lines.append('mxnet-cu112 needs CUDA 11 libraries that are not installed: %s.'
                         % ', '.join('%s (pip package %s)' % (lib.soname, lib.package)
                                     for lib in self.missing))
            packages = sorted({_PIN.get(lib.package, lib.package) for lib in self.missing})
            lines.append('Install them with:  pip install %s' % ' '.join(
                "'%s'" % p if '<' in p else p for p in packages))
            lines.append("(or all of them: pip install 'mxmp[cu112]'), or put a CUDA 11.2 / "
                         'cuDNN 8 / NCCL 2 installation on LD_LIBRARY_PATH before starting '
                         'Python.')
        for soname, error in self.failed.items():
            lines.append('%s was found but could not be loaded: %s' % (soname, error))
        if self.searched:
            shown = self.searched[:4] + (['... %d more' % (len(self.searched) - 4)]
                                         if len(self.searched) > 4 else [])
            lines.append('Searched <dir>/nvidia/*/lib/ and <dir>/ for <dir> in: %s; and the '
                         'system library path.' % ', '.join(shown))
        lines.append('Set %s=0 to skip this step (e.g. for the CPU build of MXNet).'
                     % PRELOAD_ENV)
        return '\n'.join(lines)


def _locate(lib, search_paths):
    for base in search_paths:
        for directory in (os.path.join(base, 'nvidia', lib.subdir, 'lib'), base):
            hits = sorted(glob.glob(os.path.join(glob.escape(directory), lib.soname)))
            hits = [h for h in hits if os.path.isfile(h)]
            if hits:
                return hits[0]
    return None


def _search_paths(search_paths):
    """The given directories, or site-packages, user site-packages and ``sys.path``."""
    if isinstance(search_paths, (str, os.PathLike)):
        return [os.fspath(search_paths)]
    if search_paths is not None:
        return [os.fspath(p) for p in search_paths]
    paths = list(getattr(site, 'getsitepackages', list)())   # some virtualenvs lack these
    if hasattr(site, 'getusersitepackages'):
        paths.append(site.getusersitepackages())
    paths = [os.path.abspath(p) for p in paths + [p for p in sys.path if p]]
    return [p for p in dict.fromkeys(paths) if os.path.isdir(p)]


def find_cuda_libraries(search_paths=None):
    """OrderedDict soname -> path or None of :data:`CUDA_LIBRARIES`, in load order; nothing
    is loaded. ``search_paths`` (str or list; default site-packages and ``sys.path``): each is
    searched as ``<path>/nvidia/<subdir>/lib/`` and as ``<path>/``."""
    paths = _search_paths(search_paths)
    return collections.OrderedDict((lib.soname, _locate(lib, paths)) for lib in CUDA_LIBRARIES)


def missing_cuda_libraries(search_paths=None):
    """list of CudaLibrary: the required libraries not in ``search_paths`` (as
    :func:`find_cuda_libraries`; the system search path is not looked at), in load order."""
    found = find_cuda_libraries(search_paths)
    return [lib for lib in CUDA_LIBRARIES if found[lib.soname] is None]


def cuda_library_dirs(search_paths=None):
    """list of str: the directories of the found libraries (for ``LD_LIBRARY_PATH``), in load
    order."""
    found = find_cuda_libraries(search_paths).values()
    return list(dict.fromkeys(os.path.dirname(path) for path in found if path is not None))


def preload_cuda_libraries(search_paths=None, loader=None, system_fallback=True):
    """Open every library of :data:`CUDA_LIBRARIES` (and the present optional ones) with
    ``loader``, dependencies first, before ``import mxnet``.

    Args:
        search_paths (list of str or None): as for :func:`find_cuda_libraries`.
        loader (callable or None): ``loader(path_or_soname)``, raising OSError on failure;
            default ``ctypes.CDLL(path, mode=RTLD_GLOBAL)``.
        system_fallback (bool): try a library not in ``search_paths`` by its soname on the
            system search path. Default True.

    Returns:
        list of str: what was loaded, in order (paths, or sonames from the system path).

    Raises:
        CudaLibrariesNotFound: required libraries missing or failing to load (all listed).
    """
    paths = _search_paths(search_paths)
    load = loader or (lambda path: ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL))
    loaded, missing, failed = [], [], {}
    for lib, required in _LOAD_ORDER:
        path = _locate(lib, paths)
        if path is None and not required:
            continue
        if path is None and not system_fallback:
            missing.append(lib)
            continue
        try:
            load(path or lib.soname)
        except OSError as err:
            if path is None:
                missing.append(lib)
            elif required:
                failed[lib.soname] = str(err)
            continue
        loaded.append(path or lib.soname)
    if missing or failed:
        raise CudaLibrariesNotFound(missing, failed, paths)
    if loader is None:
        _LOADED.extend(loaded)
    return loaded


def _installed(distribution):
    for name in (distribution, distribution.replace('-', '_')):
        try:
            importlib.metadata.distribution(name)
            return True
        except importlib.metadata.PackageNotFoundError:
            continue
    return False


def should_preload(environ=None, is_installed=None):
    """bool: whether ``import mxmp`` preloads: :data:`PRELOAD_ENV` in ``environ`` (default
    ``os.environ``) if set, else whether ``is_installed(name)`` (default: importlib.metadata)
    holds for a distribution of :data:`CUDA_DISTRIBUTIONS`.

    Raises:
        ValueError: ``MXMP_PRELOAD_CUDA`` has another value.
    """
    environ = os.environ if environ is None else environ
    value = environ.get(PRELOAD_ENV, '').strip().lower()
    if value in ('1', 'true', 'yes', 'on'):
        return True
    if value in ('0', 'false', 'no', 'off'):
        return False
    if value:
        raise ValueError('%s=%r: use 1 to preload the CUDA libraries at import mxmp, 0 to '
                         'never preload, or leave it unset (preload when mxnet-cu112 is '
                         'installed)' % (PRELOAD_ENV, environ[PRELOAD_ENV]))
    is_installed = is_installed or _installed
    return any(is_installed(d) for d in CUDA_DISTRIBUTIONS)


def preload_if_needed(environ=None, is_installed=None, search_paths=None, loader=None):
    """:func:`preload_cuda_libraries` if :func:`should_preload`, unless mxnet is imported
    already or the libraries were preloaded; returns what was loaded (maybe nothing)."""
    if not should_preload(environ, is_installed):
        return []
    if 'mxnet' in sys.modules or (loader is None and _LOADED):
        return []
    return preload_cuda_libraries(search_paths=search_paths, loader=loader)


def main(argv=None):
    """``python -m mxmp._src.cuda [--print-path]``: report the CUDA libraries (nothing is loaded)."""
    parser = argparse.ArgumentParser(prog='python -m mxmp._src.cuda', description=(
        'Find the CUDA 11 libraries that mxnet-cu112 needs in the nvidia-*-cu11 pip packages.'))
    parser.add_argument('--print-path', action='store_true',
                        help='print only the directories, joined by ":", for LD_LIBRARY_PATH')
    parser.add_argument('--search-path', action='append', default=None,
                        help='directory to search (repeatable); default: site-packages')
    args = parser.parse_args(argv)
    if args.print_path:
        print(os.pathsep.join(cuda_library_dirs(args.search_path)))
        return 0
    for soname, path in find_cuda_libraries(args.search_path).items():
        print('%-22s %s' % (soname, path or 'MISSING'))
    missing = missing_cuda_libraries(args.search_path)
    if missing:
        print(CudaLibrariesNotFound(missing, searched=_search_paths(args.search_path)))
        return 1
    print('all found; LD_LIBRARY_PATH alternative:\n  export LD_LIBRARY_PATH="%s:$LD_LIBRARY_PATH"'
          % os.pathsep.join(cuda_library_dirs(args.search_path)))
    return 0


if __name__ == '__main__':
    sys.exit(main())
