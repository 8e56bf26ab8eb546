"""Model files and batches for the ``mxmp`` command: load and check a symbol and its parameters,
convert or fuse them, write them, and the float32 network and batch ``mxmp diagnose``
runs. Every problem with the user's files raises :class:`CLIError` naming it.
"""
import json
import os
import re
import sys

from .errors import CLIError, mxnet_error_line


def need_file(path, what):
    """Raise CLIError unless ``path`` is an existing file (``what`` names it in the message)."""
    if not os.path.exists(path):
        raise CLIError('%s %s does not exist' % (what, path))
    if not os.path.isfile(path):
        raise CLIError('%s %s is not a file' % (what, path))


def load_symbol(path):
    """Load ``path`` as an MXNet Symbol; CLIError naming the problem otherwise."""
    import mxnet as mx
    need_file(path, 'symbol file')
    try:
        with open(path) as f:
            json.load(f)
    except (ValueError, UnicodeDecodeError) as err:
        raise CLIError('%s is not a symbol JSON file (%s); pass the prefix-symbol.json that '
                       'HybridBlock.export() writes' % (path, mxnet_error_line(err))) from None
    try:
        return mx.sym.load(path)
    except mx.base.MXNetError as err:
        raise CLIError('%s is not an MXNet symbol file: %s'
                       % (path, mxnet_error_line(err))) from None


def load_params(path, sym, data_names):
    """``(arg_params, aux_params)`` of a params file checked against ``sym``: CLIError if it
    is not one or lacks parameters the symbol needs; unused parameters and shapes that do not
    fit (or cannot be checked without the data shapes) only warn on stderr."""
    import mxnet as mx
    need_file(path, 'params file')
    try:
        loaded = mx.nd.load(path)
    except mx.base.MXNetError as err:
        raise CLIError('%s is not an MXNet .params file: %s' % (path, mxnet_error_line(err))) \
            from None
    if not isinstance(loaded, dict):
        raise CLIError('%s holds a list of arrays without names, not model parameters' % path)
    args, aux = set(sym.list_arguments()), set(sym.list_auxiliary_states())
    arg_params, aux_params = {}, {}
    for key, value in loaded.items():
        kind, _, name = key.partition(':')
        if not name:
            kind, name = ('aux' if key in aux else 'arg'), key
        (aux_params if kind == 'aux' else arg_params)[name] = value
    needed = [n for n in sym.list_arguments() if n not in data_names and
              not n.endswith('_label')] + sym.list_auxiliary_states()
    have = set(arg_params) | set(aux_params)
    missing = [n for n in needed if n not in have]
    if missing:
        raise CLIError('%s does not match the symbol: %d parameter(s) the symbol needs are not '
                       'in it (%s); pass the params file saved with this symbol, and the '
                       'model\'s data inputs with --data-name' % (path, len(missing),
                                                                  _first4(missing)))
    extra = sorted(have - args - aux)
    if extra:
        print('mxmp: warning: %s holds %d parameter(s) the symbol does not use (%s); they '
              'are ignored' % (path, len(extra), _first4(extra)), file=sys.stderr)
        arg_params = {k: v for k, v in arg_params.items() if k in args}
        aux_params = {k: v for k, v in aux_params.items() if k in aux}
    # Shapes can only warn: without the data shapes MXNet's partial inference fails on valid
    # graphs, e.g. arange_like(axis=0) raises "cannot handle param.axis 0" (gluonnlp's BERT);
    # the graph pass itself needs no shapes.
    shapes = {k: v.shape for k, v in list(arg_params.items()) + list(aux_params.items())}
    try:
        sym.infer_shape_partial(**{k: v for k, v in shapes.items() if k in args})
    except mx.base.MXNetError as err:
        print('mxmp: warning: could not check the parameter shapes of %s against the symbol '
              'without the data shapes (%s); going on' % (path, mxnet_error_line(err)),
              file=sys.stderr)
    return arg_params, aux_params


def _first4(names):
    return ', '.join(names[:4]) + (', ...' if len(names) > 4 else '')


def check_data_names(sym, data_names, arg_params=None):
    """Raise CLIError naming the symbol's real inputs if a data name is not one of them.
    ``arg_params`` (dict or None): the parameters, whose names are not inputs; None (no
    params file): the inputs named are the arguments no parameter file would hold, guessed as
    those that are the first input of an operator (data, not weights)."""
    unknown = [n for n in data_names if n not in sym.list_arguments()]
    if unknown:
        if arg_params is None:
            nodes = json.loads(sym.tojson())['nodes']
            firsts = {nodes[n['inputs'][0][0]]['name'] for n in nodes
                      if n['op'] != 'null' and n['inputs']}
            inputs = [n for n in sym.list_arguments() if n in firsts]
        else:
            inputs = [n for n in sym.list_arguments() if n not in arg_params]
        raise CLIError('the symbol has no input named %s; its inputs are %s (name each with '
                       '--data-name)' % (', '.join(unknown), ', '.join(inputs)))


def check_out_path(path, what, directory=False, create=False):
    """Raise CLIError before any work if the output ``path`` cannot be written: a directory
    where a file is wanted (or a file where a directory is, ``directory``), or a parent that
    does not exist (``create``: that is created later, but no part of it may be a file)."""
    path = os.path.abspath(path)
    if os.path.exists(path) and os.path.isdir(path) != directory:
        raise CLIError('%s %s exists and is %s' % (what, path, 'a file, not a directory'
                                                   if directory else 'a directory'))
    parent = os.path.dirname(path)
    while create and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise CLIError('%s %s: %s %s' % (what, path, parent, 'is a file' if os.path.exists(
            parent) else 'does not exist'))


def epoch_of(params_path):
    """int: the NNNN of ``prefix-NNNN.params`` (0 for another file name)."""
    m = re.search(r'-(\d+)\.params$', params_path)
    return int(m.group(1)) if m else 0


def save_model(prefix, epoch, sym, arg_params, aux_params):
    """Write ``prefix-symbol.json`` (casts kept) and ``prefix-NNNN.params`` (``arg:``/``aux:``
    keys, as ``Module.save_checkpoint``); returns the two paths."""
    import mxnet as mx
    from .files import save_atomic
    sym_path, params_path = '%s-symbol.json' % prefix, '%s-%04d.params' % (prefix, epoch)
    save_atomic(sym_path, lambda tmp: sym.save(tmp, remove_amp_cast=False))
    arrays = {'%s:%s' % (kind, k): v.as_in_context(mx.cpu())
              for kind, params in (('arg', arg_params), ('aux', aux_params))
              for k, v in params.items()}
    save_atomic(params_path, lambda tmp: mx.nd.save(tmp, arrays))
    return sym_path, params_path


def convert_model(sym, arg_params, aux_params, dtype, cast_params, emulate, data_names,
                  library_ops=False):
    """The mixed-precision model ``(graph, arg_params, aux_params)``: :func:`mxmp.convert_symbol`'s
    graph, with MXNet's own ops in place of those of mxmp's library unless ``library_ops``
    (plain MXNet loads it); arrays float32 except those the graph stores or pins
    (``__dtype__``) to another dtype, which plain MXNet needs in that dtype to bind. CLIError if
    the pass refuses it."""
    from .graph.strip import arrays_for_graph, without_library_ops
    from .graph.convert import convert_symbol
    try:
        out = convert_symbol(sym, dtype, cast_params=cast_params, emulate=emulate,
                             data_names=data_names)
    except ValueError as err:
        raise CLIError(str(err)) from None
    out = out if library_ops else without_library_ops(out)
    return out, arrays_for_graph(out, arg_params), arrays_for_graph(out, aux_params)


def fold_model(sym, arg_params, aux_params):
    """The float32 graph of ``sym`` with its BatchNorms folded into the Convolutions before
    them (:func:`mxmp._src.graph.fold.fold_batchnorm`; what ``--fuse`` runs, so that MXNet
    does not fold them into bfloat16 weights by truncation), and its ``(arg_params,
    aux_params)``: the folded weights and biases computed in float32, the arrays the graph no
    longer reads left out. ``sym``, unchanged, when nothing folds."""
    from .graph.fold import fold_batchnorm, folded_values
    from .graph.strip import remove_casts
    folded, folds = fold_batchnorm(remove_casts(sym))
    if not folds:
        return sym, arg_params, aux_params
    every = dict(arg_params, **aux_params)
    args = dict(arg_params)
    for fold in folds:
        args[fold.new_weight], args[fold.new_bias] = folded_values(fold, every.__getitem__)
    keep_args, keep_aux = set(folded.list_arguments()), set(folded.list_auxiliary_states())
    return (folded, {k: v for k, v in args.items() if k in keep_args},
            {k: v for k, v in aux_params.items() if k in keep_aux})


def fuse_model(sym, arg_params, aux_params, shapes, data_names):
    """``sym`` partitioned by oneDNN's fusion for inference (``optimize_for('MKLDNN')``; plain
    MXNet with oneDNN runs it). CLIError if a data input has no shape in ``shapes`` (nothing
    would fuse), an output also feeds another node (as :class:`mxmp._src.gluon_graph.
    FusedInference`, such graphs are not fused) or the backend refuses the graph."""
    import mxnet as mx
    from .fused_inference import BACKEND, unsafe_outputs
    missing = [n for n in data_names if n not in shapes]
    if missing:
        raise CLIError('--fuse needs the shape of every data input to find the patterns: '
                       'add --shape %s=1,3,224,224 (your model\'s input shape; the fused '
                       'graph then runs any batch size)' % missing[0])
    unsafe = unsafe_outputs(sym)
    if unsafe:
        raise CLIError('output(s) %s also feed another node, where MXNet 1.9.1\'s oneDNN fusion '
                       'can return a wrong value; convert without --fuse' % ', '.join(unsafe))
    try:
        return sym.optimize_for(BACKEND, dict(arg_params), dict(aux_params), mx.cpu(),
                                shape_dict=dict(shapes))
    except mx.base.MXNetError as err:
        raise CLIError('oneDNN fusion refused this graph (%s); convert without --fuse'
                       % str(err).strip().splitlines()[0]) from None


def diagnose_batch(net, args, ctx):
    """``(data, label, description)`` of the batch ``mxmp diagnose`` runs on ``ctx``: the
    first images of ``args.rec``, else synthetic N(0, 1) data with random labels. ``net`` runs
    once on it: CLIError if it cannot, is not a classifier, or has fewer classes than labels."""
    import mxnet as mx
    import numpy as np
    rng = np.random.RandomState(args.seed)
    others = [mx.nd.array(rng.normal(size=(args.batch_size,) + tuple(dict(args.shape)[n])),
                          ctx=ctx) for n in args.data_name[1:]]   # checked by cmd_diagnose
    if args.rec:
        data, label = _read_rec(args.rec, args.batch_size, args.data_shape, args.mean_rgb,
                                args.std_rgb, ctx)
        source = '%s (first %d images, %s)' % (args.rec, data.shape[0], 'x'.join(
            str(s) for s in data.shape[1:]))
    else:
        shape = args.data_shape or (3, 32, 32)
        data = mx.nd.array(rng.normal(size=(args.batch_size,) + tuple(shape)), ctx=ctx)
        label = None
        source = 'synthetic N(0, 1) data %s' % 'x'.join(str(s) for s in data.shape)
    if others:
        data = (data,) + tuple(others)
        source += ' and synthetic N(0, 1) %s' % ', '.join(
            '%s %s' % (n, 'x'.join(str(s) for s in o.shape))
            for n, o in zip(args.data_name[1:], others))
    try:
        out = net(*data) if others else net(data)
    except mx.base.MXNetError as err:
        raise CLIError('the model cannot run on data of shape %s: %s (set --data-shape%s)'
                       % (', '.join(str(d.shape) for d in data) if others else data.shape,
                          mxnet_error_line(err), ' and --shape' if others else '')) from None
    out = out[0] if isinstance(out, (list, tuple)) else out
    if out.ndim != 2:
        raise CLIError('diagnose needs a classifier (output batch x classes); this model '
                       'outputs shape %s' % (out.shape,))
    classes = out.shape[1]
    if label is None:
        label = mx.nd.array(rng.randint(0, classes, size=(args.batch_size,)), ctx=ctx)
    elif float(label.max().asscalar()) >= classes:
        raise CLIError('labels of %s go up to %d but the model has %d classes'
                       % (args.rec, int(label.max().asscalar()), classes))
    return data, label, source


def strip_loss_heads(sym):
    """``sym`` with its loss-output heads (the LOSS_OUTPUT class: ``SoftmaxOutput``...)
    replaced by their data input: diagnose computes the loss itself, and a Module symbol's
    label is not a network input."""
    import mxnet as mx
    from .policy.tables import classes_for
    loss_ops = set(classes_for('float16')['LOSS_OUTPUT'])
    outs = []
    for i in range(len(sym.list_outputs())):
        js = json.loads(sym[i].tojson())
        loss = js['nodes'][js['heads'][0][0]]['op'] in loss_ops
        outs.append(sym[i].get_children()[0] if loss else sym[i])
    return outs[0] if len(outs) == 1 else mx.sym.Group(outs)


def float32_block(sym, arg_params, aux_params, data_names, ctx):
    """A saved graph (casts removed, loss heads stripped) and its parameters (any float dtype)
    as an initialized float32 ``gluon.SymbolBlock`` with inputs ``data_names`` (tuple of str)
    for :func:`mxmp.diagnose`; ValueError if
    a parameter of the graph is in neither dict."""
    import warnings
    import mxnet as mx
    from mxnet import gluon
    from .graph.strip import float32_arrays, remove_casts
    sym = strip_loss_heads(remove_casts(sym))   # diagnose looks at the float32 graph
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        net = gluon.SymbolBlock(sym, [mx.sym.var(n) for n in data_names])
    values = float32_arrays(dict(aux_params, **arg_params))
    for name, param in net.collect_params().items():
        value = values.get(name)
        if value is None:
            raise ValueError('parameter %s is missing from the parameters given' % name)
        param.shape = value.shape
        param.initialize(ctx=ctx)
        param.set_data(value)
    return net


def _read_rec(rec, batch_size, data_shape, mean_rgb, std_rgb, ctx):
    """``(data, label)``: the first ``batch_size`` images of ``rec`` (no shuffling, wrapping
    around), each channel ``(pixel - mean) / std`` on the 0-255 scale, and their labels;
    ``data_shape`` (C, H, W) defaults to the first record's. ValueError naming the problem if
    MXNet cannot read it."""
    import mxnet as mx
    if data_shape is None:
        img = empty = object()
        try:
            reader = mx.recordio.MXRecordIO(rec, 'r')
            item = reader.read()
            reader.close()
            if item is not None:
                _, img = mx.recordio.unpack_img(item, iscolor=-1)
        except Exception as err:  # MXNetError, cv2 errors on a file that is not RecordIO
            raise ValueError('%s is not an image RecordIO file (%s)'
                             % (rec, mxnet_error_line(err))) from None
        if img is empty:
            raise ValueError('%s holds no record' % rec)
        if img is None:
            raise ValueError('%s: the first record is not an encoded image' % rec)
        data_shape = (3, img.shape[0], img.shape[1])
    try:
        it = mx.io.ImageRecordIter(
            path_imgrec=rec, data_shape=data_shape, batch_size=batch_size,
            shuffle=False, round_batch=True, preprocess_threads=1, verbose=False,
            mean_r=mean_rgb[0], mean_g=mean_rgb[1], mean_b=mean_rgb[2],
            std_r=std_rgb[0], std_g=std_rgb[1], std_b=std_rgb[2])
        batch = next(iter(it))
    except mx.base.MXNetError as err:
        raise ValueError('cannot read %s: %s' % (rec, mxnet_error_line(err))) from None
    return batch.data[0].as_in_context(ctx), batch.label[0].as_in_context(ctx)
