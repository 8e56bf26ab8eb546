"""Make the CUDA 11 libraries of the ``nvidia-*-cu11`` pip packages visible to mxnet-cu112.

``mxnet-cu112==1.9.1`` (the CUDA 11.2 build of MXNet on PyPI) links against the CUDA 11
runtime libraries by soname (``libcudart.so.11.0``, ``libcublas.so.11``, ``libcudnn.so.8``,
...; list read from the wheel's ``libmxnet.so`` with ``readelf -d``) but does not ship them.
NVIDIA publishes them as pip packages (``nvidia-cuda-runtime-cu11``, ``nvidia-cublas-cu11``,
``nvidia-cudnn-cu11``, ...; mxmp's ``cu112`` extra installs them), which put each library in
``site-packages/nvidia/<package>/lib/``. The dynamic loader does not search there, so
``import mxnet`` fails with "libcudart.so.11.0: cannot open shared object file".

Two ways to fix that, both before mxnet is imported:

1. **Preload** (what mxmp does when asked, see :func:`preload_if_needed`):
   :func:`preload_cuda_libraries` opens every library with ``ctypes.CDLL(path,
   mode=RTLD_GLOBAL)`` in dependency order (cudart first, cuDNN's sub-libraries before
   ``libcudnn.so.8``). When ``libmxnet.so`` is loaded afterwards, the dynamic loader finds each
   needed soname already loaded and reuses it (glibc matches ``DT_NEEDED`` entries against
   the sonames of loaded objects).
2. **Environment**: put the directories on ``LD_LIBRARY_PATH`` *before the Python process
   starts* (the loader reads it once, at process start; setting ``os.environ`` from Python is
   too late)::

       export LD_LIBRARY_PATH="$(python -m mxmp._src.cuda --print-path):$LD_LIBRARY_PATH"

   ``python -m mxmp._src.cuda`` prints what is found and missing. ``python -m`` imports the mxmp
   package (and so mxnet) first; where mxnet cannot be imported yet, run this file directly,
   which imports neither: ``python "$(dirname "$(python -c 'import importlib.util as u;
   print(u.find_spec("mxmp").origin)')")/cuda.py" --print-path``. A system CUDA 11.2 toolkit
   with cuDNN 8 and NCCL 2 on ``LD_LIBRARY_PATH`` or in the ldconfig cache works as well.

The GPU driver's ``libcuda.so.1`` is not a pip package: it comes with the NVIDIA driver
(``nvidia-smi`` must work), and mxnet-cu112 needs a driver for CUDA 11.2 (>= 460).

Nothing here imports mxnet, and nothing runs on ``import mxmp._src.cuda``.
"""
import argparse
import collections
import ctypes
import glob
import importlib.metadata
import os
import site
import sys

__all__ = ['CudaLibrary', 'CUDA_LIBRARIES', 'OPTIONAL_CUDA_LIBRARIES', 'CudaLibrariesNotFound',
           'find_cuda_libraries', 'missing_cuda_libraries', 'preload_cuda_libraries',
           'cuda_library_dirs', 'should_preload', 'preload_if_needed', 'PRELOAD_ENV',
           'CUDA_DISTRIBUTIONS']

CudaLibrary = collections.namedtuple('CudaLibrary', ['soname', 'package', 'subdir'])
CudaLibrary.__doc__ = """One shared library: its ``soname`` (file name), the pip ``package``
that ships it and the ``subdir`` of ``site-packages/nvidia/`` it is installed in (its file is
``site-packages/nvidia/<subdir>/lib/<soname>``)."""

#: The libraries mxnet-cu112 1.9.1 needs (its ``libmxnet.so``'s NEEDED entries, ``readelf -d``), in load order: every
#: library comes after the ones it depends on (cuBLAS needs cuBLASLt; cuSOLVER needs cuBLAS).
CUDA_LIBRARIES = (
    CudaLibrary('libcudart.so.11.0', 'nvidia-cuda-runtime-cu11', 'cuda_runtime'),
    CudaLibrary('libnvToolsExt.so.1', 'nvidia-nvtx-cu11', 'nvtx'),
    CudaLibrary('libcublasLt.so.11', 'nvidia-cublas-cu11', 'cublas'),
    CudaLibrary('libcublas.so.11', 'nvidia-cublas-cu11', 'cublas'),
    CudaLibrary('libnvrtc.so.11.2', 'nvidia-cuda-nvrtc-cu11', 'cuda_nvrtc'),
    CudaLibrary('libcurand.so.10', 'nvidia-curand-cu11', 'curand'),
    CudaLibrary('libcufft.so.10', 'nvidia-cufft-cu11', 'cufft'),
    CudaLibrary('libcusolver.so.11', 'nvidia-cusolver-cu11', 'cusolver'),
    CudaLibrary('libcudnn.so.8', 'nvidia-cudnn-cu11', 'cudnn'),
    CudaLibrary('libnccl.so.2', 'nvidia-nccl-cu11', 'nccl'),
)

#: Loaded when present, never reported missing: libraries that the required ones open at run
#: time by soname (cuDNN 8's sub-libraries, NVRTC's builtins) or need on some CUDA 11
#: releases (cuSPARSE for cuSOLVER). Each is inserted just before the first library of
#: ``CUDA_LIBRARIES`` named in ``before``. Shell-style patterns are allowed.
OPTIONAL_CUDA_LIBRARIES = (
    (CudaLibrary('libnvrtc-builtins.so.11.*', 'nvidia-cuda-nvrtc-cu11', 'cuda_nvrtc'),
     'libcurand.so.10'),
    (CudaLibrary('libcusparse.so.11', 'nvidia-cusparse-cu11', 'cusparse'), 'libcusolver.so.11'),
    (CudaLibrary('libcudnn_ops_infer.so.8', 'nvidia-cudnn-cu11', 'cudnn'), 'libcudnn.so.8'),
    (CudaLibrary('libcudnn_ops_train.so.8', 'nvidia-cudnn-cu11', 'cudnn'), 'libcudnn.so.8'),
    (CudaLibrary('libcudnn_cnn_infer.so.8', 'nvidia-cudnn-cu11', 'cudnn'), 'libcudnn.so.8'),
    (CudaLibrary('libcudnn_cnn_train.so.8', 'nvidia-cudnn-cu11', 'cudnn'), 'libcudnn.so.8'),
    (CudaLibrary('libcudnn_adv_infer.so.8', 'nvidia-cudnn-cu11', 'cudnn'), 'libcudnn.so.8'),
    (CudaLibrary('libcudnn_adv_train.so.8', 'nvidia-cudnn-cu11', 'cudnn'), 'libcudnn.so.8'),
)

#: Environment variable: ``1``/``true``/``yes`` forces the preload at ``import mxmp``,
#: ``0``/``false``/``no`` prevents it; unset: preload when a CUDA build of MXNet is installed.
PRELOAD_ENV = 'MXMP_PRELOAD_CUDA'

#: Distributions whose presence means "MXNet with CUDA 11.2": preload at ``import mxmp``.
CUDA_DISTRIBUTIONS = ('mxnet-cu112',)

#: cuDNN 9 also has a ``-cu11`` package; mxnet-cu112 needs cuDNN 8.
_PIN = {'nvidia-cudnn-cu11': 'nvidia-cudnn-cu11<9'}

_LOADED = {}  # soname -> path (or soname, when loaded from the system search path)


class CudaLibrariesNotFound(ImportError):
    """The CUDA 11 libraries mxnet-cu112 needs are not all installed (or fail to load).

    Attributes:
        missing (list of CudaLibrary): every library that was not found.
        failed (dict of str -> str): soname -> loader error, for libraries that were found but
            could not be loaded (e.g. a dependency of theirs is missing).
        searched (list of str): the directories that were searched.
    """

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


def _default_search_paths():
    paths = []
    try:
        paths.extend(site.getsitepackages())
    except AttributeError:  # some virtualenv versions lack it
        pass
    try:
        paths.append(site.getusersitepackages())
    except AttributeError:
        pass
    paths.extend(p for p in sys.path if p)
    seen, out = set(), []
    for p in paths:
        p = os.path.abspath(p)
        if p not in seen and os.path.isdir(p):
            seen.add(p)
            out.append(p)
    return out


def _locate(lib, search_paths):
    """First file for ``lib`` under ``<path>/nvidia/<subdir>/lib/`` or directly in ``<path>``."""
    for base in search_paths:
        for directory in (os.path.join(base, 'nvidia', lib.subdir, 'lib'), base):
            hits = sorted(glob.glob(os.path.join(glob.escape(directory), lib.soname)))
            hits = [h for h in hits if os.path.isfile(h)]
            if hits:
                return hits[0]
    return None


def _search_paths(search_paths):
    if search_paths is None:
        return _default_search_paths()
    if isinstance(search_paths, (str, os.PathLike)):
        search_paths = [search_paths]
    return [os.fspath(p) for p in search_paths]


def find_cuda_libraries(search_paths=None):
    """Where each required CUDA library is, without loading anything.

    Args:
        search_paths (list of str or None): directories to search; each is tried as a
            site-packages directory (``<path>/nvidia/<package>/lib/<soname>``) and as a plain
            library directory (``<path>/<soname>``). Default: ``site.getsitepackages()``, the
            user site-packages and ``sys.path``.

    Returns:
        collections.OrderedDict: soname -> absolute path, or None when not found, for every
        entry of :data:`CUDA_LIBRARIES`, in load order.
    """
    paths = _search_paths(search_paths)
    return collections.OrderedDict((lib.soname, _locate(lib, paths)) for lib in CUDA_LIBRARIES)


def missing_cuda_libraries(search_paths=None):
    """The required CUDA libraries that are not in ``search_paths`` (nothing is loaded).

    Args:
        search_paths (list of str or None): as for :func:`find_cuda_libraries`.

    Returns:
        list of CudaLibrary: in load order; empty when every library is there. Libraries on
        the system search path (``LD_LIBRARY_PATH``, ldconfig) are not looked for here:
        :func:`preload_cuda_libraries` tries them.
    """
    found = find_cuda_libraries(search_paths)
    return [lib for lib in CUDA_LIBRARIES if found[lib.soname] is None]


def cuda_library_dirs(search_paths=None):
    """The directories holding the found CUDA libraries, for ``LD_LIBRARY_PATH``.

    Returns:
        list of str: unique directories, in load order of the libraries they hold.
    """
    dirs = []
    for path in find_cuda_libraries(search_paths).values():
        if path is not None and os.path.dirname(path) not in dirs:
            dirs.append(os.path.dirname(path))
    return dirs


def _load_order(search_paths):
    """[(CudaLibrary, path or None, required)] in dependency order."""
    order = []
    for lib in CUDA_LIBRARIES:
        for optional, before in OPTIONAL_CUDA_LIBRARIES:
            if before == lib.soname:
                path = _locate(optional, search_paths)
                if path is not None:
                    order.append((optional, path, False))
        order.append((lib, _locate(lib, search_paths), True))
    return order


def _ctypes_loader(path):
    return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


def preload_cuda_libraries(search_paths=None, loader=None, system_fallback=True):
    """Load the CUDA 11 libraries mxnet-cu112 needs, globally, before ``import mxnet``.

    Every library of :data:`CUDA_LIBRARIES` (and any of :data:`OPTIONAL_CUDA_LIBRARIES` that
    is present) is opened with ``loader(path)``, dependencies first. A required library not
    found in ``search_paths`` is tried by its soname on the system search path
    (``LD_LIBRARY_PATH``, the ldconfig cache) when ``system_fallback`` is True. All missing
    libraries are collected before the error is raised, so one error lists them all.

    Args:
        search_paths (list of str or None): as for :func:`find_cuda_libraries`.
        loader (callable or None): ``loader(path_or_soname)`` opens one library and raises
            OSError on failure; default ``ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)``
            (RTLD_GLOBAL so that later libraries, and libmxnet.so, resolve symbols against it).
            Tests inject a fake one.
        system_fallback (bool): try a library that is not in ``search_paths`` by soname.
            Default True.

    Returns:
        list of str: what was loaded, in order: absolute paths, or bare sonames for libraries
        loaded from the system search path.

    Raises:
        CudaLibrariesNotFound (an ImportError): one or more required libraries are missing or
            fail to load; the message lists every one with the ``pip install`` command that
            provides it.
    """
    paths = _search_paths(search_paths)
    load = loader or _ctypes_loader
    loaded, missing, failed = [], [], {}
    for lib, path, required in _load_order(paths):
        if path is None:
            if not system_fallback:
                missing.append(lib)
                continue
            try:
                load(lib.soname)
            except OSError:
                missing.append(lib)
                continue
            loaded.append(lib.soname)
            continue
        try:
            load(path)
        except OSError as err:
            if required:
                failed[lib.soname] = str(err)
            continue
        loaded.append(path)
    if missing or failed:
        raise CudaLibrariesNotFound(missing, failed, paths)
    if loader is None:
        for item in loaded:
            _LOADED[os.path.basename(item)] = item
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
    """Whether ``import mxmp`` should preload the CUDA libraries.

    Args:
        environ (mapping or None): default ``os.environ``.
        is_installed (callable or None): ``is_installed(distribution_name) -> bool``; default
            looks the distribution up with ``importlib.metadata``.

    Returns:
        bool: the value of ``MXMP_PRELOAD_CUDA`` when it is set (``1``/``true``/``yes`` or
        ``0``/``false``/``no``); otherwise True exactly when a distribution of
        :data:`CUDA_DISTRIBUTIONS` (``mxnet-cu112``) is installed.

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
    """Call :func:`preload_cuda_libraries` when :func:`should_preload` says so.

    Meant for the first lines of ``mxmp/__init__.py``, before anything imports mxnet. Does
    nothing when mxnet is already imported (its libraries are loaded, or it failed: too late
    either way) or when the libraries were preloaded before.

    Returns:
        list of str: what was loaded (empty when nothing was done).

    Raises:
        CudaLibrariesNotFound: as :func:`preload_cuda_libraries`.
    """
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
    found = find_cuda_libraries(args.search_path)
    for soname, path in found.items():
        print('%-22s %s' % (soname, path or 'MISSING'))
    missing = [lib for lib in CUDA_LIBRARIES if found[lib.soname] is None]
    if missing:
        print(CudaLibrariesNotFound(missing, searched=_search_paths(args.search_path)))
        return 1
    print('all found; LD_LIBRARY_PATH alternative:\n  export LD_LIBRARY_PATH="%s:$LD_LIBRARY_PATH"'
          % os.pathsep.join(cuda_library_dirs(args.search_path)))
    return 0


if __name__ == '__main__':
    sys.exit(main())
