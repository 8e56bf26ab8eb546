"""The build's patch of lib_api (mxmp/_src/kernels/build.py, ``LIB_API_PATCH``) lets a library op
take and return bfloat16: MXNet 1.9.1's core hands library ops bfloat16 tensors (dtype enum 12)
and accepts 12 from their type inference, but the wheel's ``lib_api.cc`` throws in
``MXTensor::setDLTensor`` for any dtype its seven-entry ``MXDType`` lacks.

A test library of one op (``bf16_probe_scale``: out = 2 x, bfloat16 only) is compiled in a
subprocess with the patched lib_api copies, as mxmp's build compiles them, and run there on a
bfloat16 NDArray and in a bound bfloat16 graph, forward and backward; against the unpatched
wheel files the same op fails. The patch's anchors are checked on the installed wheel, and a
file without them is a clear error.
"""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from mxmp._src.kernels import build  # noqa: E402

OP = textwrap.dedent(r'''
    #include <cstdint>
    #include <cstring>
    #include "mxnet/lib_api.h"
    using namespace mxnet::ext;
    typedef std::unordered_map<std::string, std::string> Attrs;
    typedef std::vector<std::vector<unsigned>> Shapes;
    static float load(uint16_t v) {
      uint32_t b = uint32_t(v) << 16; float f; std::memcpy(&f, &b, 4); return f;
    }
    static uint16_t store(float f) {   // exact for the values here (2 x bfloat16)
      uint32_t b; std::memcpy(&b, &f, 4); return uint16_t(b >> 16);
    }
    MXReturnValue parse(const Attrs&, int* i, int* o) { *i = 1; *o = 1; return MX_SUCCESS; }
    MXReturnValue itype(const Attrs&, std::vector<int>* in, std::vector<int>* out) {
      const int t = (*in)[0] != -1 ? (*in)[0] : (*out)[0];
      if (t != -1 && t != 12) {
        MX_ERROR_MSG << "bf16_probe_scale: bfloat16 only, got " << t; return MX_FAIL;
      }
      (*in)[0] = t; (*out)[0] = t; return MX_SUCCESS;
    }
    MXReturnValue ishape(const Attrs&, Shapes* in, Shapes* out) {
      (*out)[0] = (*in)[0]; return MX_SUCCESS;
    }
    static MXReturnValue scale(MXTensor& x, MXTensor& y) {
      if (x.dtype != 12 || y.dtype != 12 || x.dltensor.dtype.code != 4 ||
          x.dltensor.dtype.bits != 16) {
        MX_ERROR_MSG << "bf16_probe_scale: not a bfloat16 tensor"; return MX_FAIL;
      }
      const uint16_t* a = x.data<uint16_t>(); uint16_t* b = y.data<uint16_t>();
      for (int64_t i = 0; i < x.size(); ++i) b[i] = store(2.0f * load(a[i]));
      return MX_SUCCESS;
    }
    MXReturnValue fwd(const Attrs&, std::vector<MXTensor>* in, std::vector<MXTensor>* out,
                      const OpResource&) { return scale((*in)[0], (*out)[0]); }
    MXReturnValue bwd(const Attrs&, std::vector<MXTensor>* in, std::vector<MXTensor>* out,
                      const OpResource&) { return scale((*in)[0], (*out)[0]); }
    REGISTER_OP(bf16_probe_scale).setParseAttrs(parse).setInferType(itype)
        .setInferShape(ishape).setForward(fwd, "cpu").setBackward(bwd, "cpu");
    MXReturnValue initialize(int) { return MX_SUCCESS; }
''')

RUN = textwrap.dedent('''
    import sys
    import numpy as np
    import mxnet as mx
    from mxnet import autograd
    from mxnet.contrib.amp.amp import bfloat16
    mx.library.load(sys.argv[1], verbose=False)
    x32 = np.array([[1.5, -2.25, 3.0], [0.0, 1e-3, -7.5]], dtype=np.float32)
    x = mx.nd.amp_cast(mx.nd.array(x32), dtype=bfloat16)
    x.attach_grad()
    with autograd.record():
        y = mx.nd.bf16_probe_scale(x)
    y.backward(mx.nd.amp_cast(mx.nd.ones(x.shape), dtype=bfloat16))
    assert y.dtype == bfloat16 and x.grad.dtype == bfloat16, (y.dtype, x.grad.dtype)
    ref = mx.nd.amp_cast(x, dtype='float32').asnumpy()
    np.testing.assert_array_equal(mx.nd.amp_cast(y, dtype='float32').asnumpy(), 2 * ref)
    np.testing.assert_array_equal(mx.nd.amp_cast(x.grad, dtype='float32').asnumpy(), 2)
    # a graph: type inference gives bfloat16 (12) to and from the library op
    d = mx.sym.var('data')
    s = mx.sym.amp_cast(mx.sym.bf16_probe_scale(mx.sym.amp_cast(d, dtype=bfloat16)),
                        dtype='float32')
    _, out_t, _ = mx.sym.bf16_probe_scale(mx.sym.var('b', dtype=bfloat16)).infer_type()
    assert out_t == [bfloat16], out_t
    exe = s.simple_bind(mx.cpu(), data=x32.shape)
    exe.arg_dict['data'][:] = x32
    out = exe.forward(is_train=True)[0]
    exe.backward(mx.nd.ones(x32.shape))
    np.testing.assert_array_equal(out.asnumpy(), 2 * ref)
    np.testing.assert_array_equal(exe.grad_dict['data'].asnumpy(), 2)
    print('ok')
''')


def _compiler():
    if not any(shutil.which(c) for c in (os.environ.get('CXX') or 'g++', 'g++', 'c++')):
        pytest.skip("no C++ compiler: the library cannot build here (MXNet's kernels run)")
    return build.compiler_command()


def _build_probe(tmp_path, patched):
    src = tmp_path / 'probe.cc'
    src.write_text(OP)
    root = build._mxnet_dir()
    if patched:
        include, lib_api = build.patch_lib_api(root, str(tmp_path / 'patched'))
    else:
        include, lib_api = (os.path.join(root, 'include'), os.path.join(root, 'src', 'lib_api.cc'))
    out = str(tmp_path / 'libprobe.so')
    flags = [f for f in build.FLAGS if f not in ('-O3', '-march=native', '-fopenmp')] + ['-O0']
    proc = subprocess.run([*_compiler(), *flags, '-I' + include, '-I' + os.path.join(
        root, 'include'), str(src), lib_api, '-o', out], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def _run(lib):
    return subprocess.run([sys.executable, '-c', RUN, lib], capture_output=True, text=True,
                          timeout=300)


def test_patched_lib_api_passes_bfloat16_to_a_library_op_and_back(tmp_path):
    pytest.importorskip('mxnet')
    proc = _run(_build_probe(tmp_path, patched=True))
    assert proc.returncode == 0 and proc.stdout.strip().endswith('ok'), proc.stderr[-3000:]


def test_unpatched_lib_api_refuses_bfloat16(tmp_path):
    """What the patch fixes: the wheel's own lib_api.cc throws for dtype 12."""
    pytest.importorskip('mxnet')
    proc = _run(_build_probe(tmp_path, patched=False))
    assert proc.returncode != 0
    assert 'Invalid dtype flag: 12' in proc.stderr, proc.stderr[-3000:]


def test_the_patch_names_the_file_whose_anchor_is_missing(tmp_path):
    pytest.importorskip('mxnet')
    root = tmp_path / 'wheel'
    for rel in ('include/mxnet/lib_api.h', 'src/lib_api.cc'):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.join(build._mxnet_dir(), rel), root / rel)
    text = (root / 'src/lib_api.cc').read_text()
    (root / 'src/lib_api.cc').write_text(text.replace('  case kInt64:', '  case kInt64 :'))
    with pytest.raises(RuntimeError, match=r'src/lib_api\.cc.*does not apply.*MXNet 1\.9'):
        build.patch_lib_api(str(root), str(tmp_path / 'out'))
    patched = tmp_path / 'ok'
    build.patch_lib_api(build._mxnet_dir(), str(patched))   # the installed wheel: applies
    assert 'kBfloat16 = 12' in (patched / 'include/mxnet/lib_api.h').read_text()
