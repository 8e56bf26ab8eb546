"""mxmp._src.cuda: finding and preloading the CUDA 11 libraries of the nvidia-*-cu11 pip packages.

Everything is simulated: a temporary site-packages with empty files named like the real
libraries, and an injected loader that records what it is asked to open (no dlopen of fakes).
"""
import os
import subprocess
import sys

import pytest

from mxmp._src import cuda


def make_site_packages(root, skip=()):
    """Create ``root/nvidia/<subdir>/lib/<soname>`` for every required library not in ``skip``."""
    for lib in cuda.CUDA_LIBRARIES:
        if lib.soname in skip:
            continue
        directory = root / 'nvidia' / lib.subdir / 'lib'
        directory.mkdir(parents=True, exist_ok=True)
        (directory / lib.soname).write_bytes(b'')
    return root


class RecordingLoader:
    """Opens only existing files; bare sonames (system path) fail, as on a machine without CUDA."""

    def __init__(self, fail=()):
        self.calls = []
        self.fail = fail

    def __call__(self, path):
        self.calls.append(path)
        if not os.path.isfile(path):
            raise OSError('%s: cannot open shared object file: No such file or directory' % path)
        if os.path.basename(path) in self.fail:
            raise OSError('libfoo.so.1: cannot open shared object file: No such file or directory')
        return object()


def test_required_sonames_are_the_ones_mxnet_cu112_links_against():
    assert {lib.soname for lib in cuda.CUDA_LIBRARIES} >= {
        'libcudart.so.11.0', 'libcublas.so.11', 'libcudnn.so.8', 'libnccl.so.2',
        'libcufft.so.10', 'libcusolver.so.11', 'libcurand.so.10', 'libnvrtc.so.11.2',
        'libnvToolsExt.so.1'}


def test_all_present_are_loaded_in_dependency_order(tmp_path):
    site = make_site_packages(tmp_path)
    loader = RecordingLoader()
    loaded = cuda.preload_cuda_libraries([str(site)], loader=loader)
    names = [os.path.basename(p) for p in loaded]
    assert names == [lib.soname for lib in cuda.CUDA_LIBRARIES]
    assert loaded == loader.calls
    assert all(os.path.isabs(p) and p.startswith(str(site)) for p in loaded)
    assert names.index('libcudart.so.11.0') == 0
    assert names.index('libcublasLt.so.11') < names.index('libcublas.so.11') \
        < names.index('libcusolver.so.11')
    assert cuda.missing_cuda_libraries([str(site)]) == []


def test_missing_libraries_are_all_listed_with_the_pip_command(tmp_path):
    site = make_site_packages(tmp_path, skip=('libcudnn.so.8', 'libnccl.so.2',
                                              'libcudart.so.11.0'))
    missing = cuda.missing_cuda_libraries([str(site)])
    assert [lib.soname for lib in missing] == ['libcudart.so.11.0', 'libcudnn.so.8',
                                               'libnccl.so.2']
    with pytest.raises(ImportError) as info:
        cuda.preload_cuda_libraries([str(site)], loader=RecordingLoader())
    err = info.value
    assert isinstance(err, cuda.CudaLibrariesNotFound)
    assert [lib.soname for lib in err.missing] == ['libcudart.so.11.0', 'libcudnn.so.8',
                                                   'libnccl.so.2']
    message = str(err)
    for soname in ('libcudart.so.11.0', 'libcudnn.so.8', 'libnccl.so.2'):
        assert soname in message
    assert "pip install nvidia-cuda-runtime-cu11 'nvidia-cudnn-cu11<9' nvidia-nccl-cu11" \
        in message
    assert 'LD_LIBRARY_PATH' in message
    assert 'libcublas.so.11' not in message  # present: not reported


def test_nothing_installed_lists_every_library(tmp_path):
    with pytest.raises(cuda.CudaLibrariesNotFound) as info:
        cuda.preload_cuda_libraries([str(tmp_path)], loader=RecordingLoader())
    assert len(info.value.missing) == len(cuda.CUDA_LIBRARIES)
    for lib in cuda.CUDA_LIBRARIES:
        assert lib.soname in str(info.value)
        assert lib.package.split('<')[0] in str(info.value)


def test_missing_library_found_on_system_path_is_loaded_by_soname(tmp_path):
    site = make_site_packages(tmp_path, skip=('libnccl.so.2',))
    calls = []

    def loader(path):
        calls.append(path)
        if path == 'libnccl.so.2' or os.path.isfile(path):
            return object()
        raise OSError(path)

    loaded = cuda.preload_cuda_libraries([str(site)], loader=loader)
    assert loaded[-1] == 'libnccl.so.2'
    with pytest.raises(cuda.CudaLibrariesNotFound):
        cuda.preload_cuda_libraries([str(site)], loader=loader, system_fallback=False)


def test_library_that_fails_to_load_is_reported_with_the_loader_error(tmp_path):
    site = make_site_packages(tmp_path)
    with pytest.raises(cuda.CudaLibrariesNotFound) as info:
        cuda.preload_cuda_libraries([str(site)],
                                    loader=RecordingLoader(fail=('libcusolver.so.11',)))
    assert info.value.missing == []
    assert 'libcusolver.so.11 was found but could not be loaded: libfoo.so.1' in str(info.value)


def test_optional_cudnn_sublibraries_load_before_libcudnn_when_present(tmp_path):
    site = make_site_packages(tmp_path)
    (site / 'nvidia' / 'cudnn' / 'lib' / 'libcudnn_ops_infer.so.8').write_bytes(b'')
    (site / 'nvidia' / 'cuda_nvrtc' / 'lib' / 'libnvrtc-builtins.so.11.2').write_bytes(b'')
    names = [os.path.basename(p) for p in
             cuda.preload_cuda_libraries([str(site)], loader=RecordingLoader())]
    assert names.index('libcudnn_ops_infer.so.8') == names.index('libcudnn.so.8') - 1
    assert names.index('libnvrtc.so.11.2') < names.index('libnvrtc-builtins.so.11.2')
    assert 'libcudnn_cnn_infer.so.8' not in names  # absent optional ones are not errors


def test_plain_library_directory_and_ld_library_path_dirs(tmp_path):
    for lib in cuda.CUDA_LIBRARIES:
        (tmp_path / lib.soname).write_bytes(b'')
    assert cuda.missing_cuda_libraries([str(tmp_path)]) == []
    assert cuda.cuda_library_dirs([str(tmp_path)]) == [str(tmp_path)]
    site = make_site_packages(tmp_path / 'site')
    dirs = cuda.cuda_library_dirs([str(site)])
    assert dirs[0] == str(site / 'nvidia' / 'cuda_runtime' / 'lib')
    assert len(dirs) == len({lib.subdir for lib in cuda.CUDA_LIBRARIES})


def test_should_preload_follows_env_var_then_installed_distribution():
    installed = lambda name: name == 'mxnet-cu112'  # noqa: E731
    not_installed = lambda name: False  # noqa: E731
    assert cuda.should_preload({}, installed) is True
    assert cuda.should_preload({}, not_installed) is False
    assert cuda.should_preload({'MXMP_PRELOAD_CUDA': '0'}, installed) is False
    assert cuda.should_preload({'MXMP_PRELOAD_CUDA': '1'}, not_installed) is True
    with pytest.raises(ValueError, match='MXMP_PRELOAD_CUDA'):
        cuda.should_preload({'MXMP_PRELOAD_CUDA': 'maybe'}, installed)


def test_cpu_build_does_not_preload(tmp_path):
    loader = RecordingLoader()
    assert cuda.preload_if_needed(environ={}, is_installed=lambda name: False,
                                  search_paths=[str(tmp_path)], loader=loader) == []
    assert loader.calls == []


def test_module_imports_neither_mxnet_nor_numpy_so_it_can_run_before_mxnet():
    # mxmp/__init__.py calls preload_if_needed() before anything imports mxnet; the module
    # must not pull mxnet in itself. Loaded standalone, in a fresh interpreter.
    script = ('import importlib.util, sys; '
              'spec = importlib.util.spec_from_file_location("c", %r); '
              'm = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); '
              'print(sorted({"mxnet", "numpy"} & set(sys.modules)))' % cuda.__file__)
    out = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == '[]'
