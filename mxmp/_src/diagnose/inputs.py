"""What :func:`mxmp._src.diagnose` is given from files: a float32 network from a saved graph, and a
batch of images from a RecordIO file (the ``mxmp diagnose`` command's inputs).

* :func:`float32_block`: a saved (possibly converted, possibly Module) graph and its parameters
  as a float32 ``gluon.SymbolBlock``: casts removed (:func:`mxmp.remove_casts`), loss-output
  heads (``SoftmaxOutput``...) replaced by their data input (:func:`strip_loss_heads`),
  parameters cast to float32.
* :func:`read_rec_batch`: the first batch of an image RecordIO file (``im2rec``), read with
  MXNet's own ``ImageRecordIter``, its image shape taken from the first record
  (:func:`first_record_shape`) unless given.

Every function raises ``ValueError`` naming the file and the problem for bad input.
"""
import json

from ..errors import mxnet_error_line

__all__ = ['float32_block', 'strip_loss_heads', 'first_record_shape', 'read_rec_batch',
           'output_names', 'error_line']

error_line = mxnet_error_line   # the name this module exported before


def output_names(sym):
    """Node name -> the names of its visible outputs in ``sym.get_internals()``, in order.

    Args:
        sym (mx.sym.Symbol)

    Returns:
        dict str -> list of str: e.g. ``{'fc1': ['fc1_output'], 'split0': ['split0_output0',
        'split0_output1'], 'data': ['data']}``.
    """
    names = {}
    for out in sym.get_internals().list_outputs():
        names.setdefault(out.rsplit('_output', 1)[0], []).append(out)
    return names


def strip_loss_heads(sym):
    """Replace loss-output heads (``SoftmaxOutput``, ``LinearRegressionOutput``...: the
    LOSS_OUTPUT class of ``mxmp/policy``) by their data input.

    :func:`mxmp._src.diagnose` computes the loss itself, and the label variable of a Module's symbol
    is not a network input.

    Args:
        sym (mx.sym.Symbol)

    Returns:
        mx.sym.Symbol: ``sym`` itself if no head is a loss output, else the new heads (a Group
        if there are several).
    """
    import mxnet as mx
    from ..policy.tables import classes_for
    loss_ops = set(classes_for('float16')['LOSS_OUTPUT'])
    js = json.loads(sym.tojson())
    heads, changed = [], False
    for nid, idx, version in js['heads']:
        node = js['nodes'][nid]
        if node['op'] in loss_ops and node['inputs']:
            src = node['inputs'][0]
            heads.append([src[0], src[1], src[2]])
            changed = True
        else:
            heads.append([nid, idx, version])
    if not changed:
        return sym
    internals = sym.get_internals()
    names = output_names(sym)
    outs = []
    for nid, idx, _ in heads:
        name = js['nodes'][nid]['name']
        outs.append(internals[names[name][idx]] if name in names else internals[name])
    return outs[0] if len(outs) == 1 else mx.sym.Group(outs)


def float32_block(sym, arg_params, aux_params, data_name='data', ctx=None):
    """A saved graph and its parameters as a float32 network for :func:`mxmp._src.diagnose`.

    Args:
        sym (mx.sym.Symbol): the graph, float32 or converted (casts are removed), Gluon's
            ``export()`` or a Module's (loss-output heads are stripped, :func:`strip_loss_heads`).
        arg_params, aux_params (dict str -> NDArray): its parameters, any float dtype (cast to
            float32).
        data_name (str): the data input's name. Default ``'data'``.
        ctx (mx.Context): where the parameters live; default ``mx.cpu()``.

    Returns:
        gluon.SymbolBlock: initialized with the parameters.

    Raises:
        ValueError: ``sym`` has no input ``data_name``; a parameter of the graph is in neither
            dict.
    """
    import warnings
    import mxnet as mx
    import numpy as np
    from mxnet import gluon
    from ..graph.strip import remove_casts
    if data_name not in sym.list_arguments():
        raise ValueError('the symbol has no input named %r; pass --data-name' % data_name)
    sym = strip_loss_heads(remove_casts(sym))   # diagnose looks at the float32 graph
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        net = gluon.SymbolBlock(sym, mx.sym.var(data_name))
    ctx = ctx or mx.cpu()
    for name, param in net.collect_params().items():
        value = arg_params.get(name, aux_params.get(name))
        if value is None:
            raise ValueError('parameter %s is missing from the parameters given' % name)
        param.shape = value.shape
        param.initialize(ctx=ctx)
        if np.dtype(value.dtype) != np.float32:
            value = mx.nd.amp_cast(value, dtype='float32')
        param.set_data(value)
    return net


def first_record_shape(rec):
    """(3, height, width) of the first image of a RecordIO file.

    Args:
        rec (str): path of an image ``.rec`` file (``im2rec``, ``MXRecordIO``).

    Raises:
        ValueError: the file holds no record, is not RecordIO, or its first record is not an
            encoded image.
    """
    import mxnet as mx
    img = empty = object()
    try:
        reader = mx.recordio.MXRecordIO(rec, 'r')
        item = reader.read()
        reader.close()
        if item is not None:
            _, img = mx.recordio.unpack_img(item, iscolor=-1)
    except Exception as err:  # MXNetError, cv2 errors on a file that is not RecordIO
        raise ValueError('%s is not an image RecordIO file (%s)' % (rec, error_line(err))) \
            from None
    if img is empty:
        raise ValueError('%s holds no record' % rec)
    if img is None:
        raise ValueError('%s: the first record is not an encoded image' % rec)
    return (3, img.shape[0], img.shape[1])


def read_rec_batch(rec, batch_size, data_shape=None, mean_rgb=(0, 0, 0), std_rgb=(1, 1, 1),
                   ctx=None):
    """The first ``batch_size`` images of a RecordIO file and their labels, normalised.

    Read with ``mx.io.ImageRecordIter`` (no shuffling; a file with fewer images wraps around,
    ``round_batch``); each channel becomes ``(pixel - mean) / std``.

    Args:
        rec (str): image ``.rec`` file.
        batch_size (int): images.
        data_shape (tuple of int): (channels, height, width) fed to the model; default that of
            the first record (:func:`first_record_shape`).
        mean_rgb, std_rgb (tuple of 3 floats): per-channel mean and std, 0-255 scale.
        ctx (mx.Context): default ``mx.cpu()``.

    Returns:
        (data, label): float32 NDArrays of shape (batch_size,) + data_shape and (batch_size,).

    Raises:
        ValueError: not an image RecordIO file, or MXNet cannot read it.
    """
    import mxnet as mx
    shape = data_shape or first_record_shape(rec)
    ctx = ctx or mx.cpu()
    try:
        it = mx.io.ImageRecordIter(
            path_imgrec=rec, data_shape=shape, batch_size=batch_size,
            shuffle=False, round_batch=True, preprocess_threads=1, verbose=False,
            mean_r=mean_rgb[0], mean_g=mean_rgb[1], mean_b=mean_rgb[2],
            std_r=std_rgb[0], std_g=std_rgb[1], std_b=std_rgb[2])
        batch = next(iter(it))
    except mx.base.MXNetError as err:
        raise ValueError('cannot read %s: %s' % (rec, error_line(err))) from None
    return batch.data[0].as_in_context(ctx), batch.label[0].as_in_context(ctx)
