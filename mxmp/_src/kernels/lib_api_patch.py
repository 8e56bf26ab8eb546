"""mxmp's patch of the wheel's lib_api files, applied to the copies :mod:`.build` compiles.

The wheel's ``lib_api.h`` and ``lib_api.cc`` know seven dtypes, not MXNet's bfloat16 (its
dtype enum 12), and ``MXTensor::setDLTensor`` throws for it, although MXNet's core hands library
ops bfloat16 tensors and accepts 12 from their type inference. The build compiles patched copies
of the two files (:data:`LIB_API_PATCH`, mxmp's own three insertions, applied in a temporary
directory; the wheel is not changed): ``kBfloat16 = 12`` in ``MXDType``, ``kDLBfloat = 4`` in
lib_api's DLPack type codes (DLPack's own value), and a ``setDLTensor`` case giving it DLPack's
bfloat16 (code 4, 16 bits). A wheel whose files do not hold the patch's anchors exactly once is
a build error naming the file; the patch is part of the key.
"""
import os

__all__ = ['LIB_API_PATCH', 'patch_lib_api']

#: The patch of the compiled copies of the wheel's lib_api files (module docstring): ``(file
#: relative to the wheel's mxnet directory, anchor, replacement)``; each anchor must occur once.
LIB_API_PATCH = (
    ('include/mxnet/lib_api.h',
     '    kDLFloat = 2U,\n  } DLDataTypeCode;',
     '    kDLFloat = 2U,\n    kDLBfloat = 4U,  /* mxmp: DLPack\'s bfloat16 code */\n'
     '  } DLDataTypeCode;'),
    ('include/mxnet/lib_api.h',
     '  kInt64 = 6,\n  kUNSET = 100,',
     '  kInt64 = 6,\n  kBfloat16 = 12,  /* mxmp: MXNet\'s bfloat16 (mshadow kBfloat16) */\n'
     '  kUNSET = 100,'),
    ('src/lib_api.cc',
     '  case kInt64:\n    dltensor.dtype.code = kDLInt;\n    dltensor.dtype.bits = 64;\n'
     '    break;\n  default:',
     '  case kInt64:\n    dltensor.dtype.code = kDLInt;\n    dltensor.dtype.bits = 64;\n'
     '    break;\n  case kBfloat16:  /* mxmp */\n    dltensor.dtype.code = kDLBfloat;\n'
     '    dltensor.dtype.bits = 16;\n    break;\n  default:'),
)


def patch_lib_api(root, directory):
    """Write the wheel's ``include/mxnet/lib_api.h`` and ``src/lib_api.cc`` (under ``root``, the
    mxnet package's directory) with :data:`LIB_API_PATCH` applied to ``directory`` (same
    relative paths). Returns ``(include directory, lib_api.cc path)`` of the copies.

    Raises:
        RuntimeError: a file lacks an anchor or holds it more than once (another MXNet than
            1.9.x's lib_api: the message names the file and the line the patch looks for).
    """
    texts = {}
    for rel, anchor, replacement in LIB_API_PATCH:
        if rel not in texts:
            with open(os.path.join(root, rel)) as f:
                texts[rel] = f.read()
        count = texts[rel].count(anchor)
        if count != 1:
            raise RuntimeError(
                "mxmp's bfloat16 patch of %s does not apply: the wheel's file holds %s %d "
                'time(s), not once (MXNet 1.9.x is needed; build.LIB_API_PATCH)'
                % (os.path.join(root, rel), repr(anchor.splitlines()[-1].strip()), count))
        texts[rel] = texts[rel].replace(anchor, replacement)
    for rel, text in texts.items():
        os.makedirs(os.path.join(directory, os.path.dirname(rel)), exist_ok=True)
        with open(os.path.join(directory, rel), 'w') as f:
            f.write(text)
    return os.path.join(directory, 'include'), os.path.join(directory, 'src', 'lib_api.cc')
