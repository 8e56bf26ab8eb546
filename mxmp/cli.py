"""The ``mxmp`` command: convert, explain, check-alignment, diagnose, plot, check-kernels.

``mxmp SUBCOMMAND --help`` (or ``python -m mxmp.cli``) documents each subcommand; docs/cli.md
gives examples. Models are ``prefix-symbol.json`` + ``prefix-NNNN.params`` (``arg:``/``aux:``
keys, or none). Bad input raises :class:`CLIError`, which :func:`main` prints as one line
``mxmp SUBCOMMAND: error: ...`` on stderr, exit code 1.
"""
import argparse
import json
import os
import re
import sys

from ._src.errors import CLIError, mxnet_error_line


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
    """Load a params file and check it against ``sym``.

    Returns:
        (arg_params, aux_params): dicts of name -> NDArray.

    Raises:
        CLIError: not a params file; parameters the symbol needs are missing (the symbol and
            the params are not from the same model). Shapes MXNet cannot check without the
            data shapes, or that do not fit, only warn (on stderr).
    """
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
                       'in it (%s%s); pass the params file saved with this symbol, and the '
                       'model\'s data inputs with --data-name'
                       % (path, len(missing), ', '.join(missing[:4]),
                          ', ...' if len(missing) > 4 else ''))
    extra = sorted(have - args - aux)
    if extra:
        print('mxmp: warning: %s holds %d parameter(s) the symbol does not use (%s%s); they '
              'are ignored' % (path, len(extra), ', '.join(extra[:4]),
                               ', ...' if len(extra) > 4 else ''), file=sys.stderr)
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


def check_data_names(sym, data_names, arg_params):
    """Raise CLIError naming the symbol's real inputs if a data name is not one of them."""
    unknown = [n for n in data_names if n not in sym.list_arguments()]
    if unknown:
        raise CLIError('the symbol has no input named %s; its inputs are %s'
                       % (', '.join(unknown), ', '.join(
                           n for n in sym.list_arguments() if n not in arg_params)))


def epoch_of(params_path):
    """int: the NNNN of ``prefix-NNNN.params`` (0 for another file name)."""
    m = re.search(r'-(\d+)\.params$', params_path)
    return int(m.group(1)) if m else 0


def save_model(prefix, epoch, sym, arg_params, aux_params):
    """Write ``prefix-symbol.json`` (casts kept) and ``prefix-NNNN.params`` (``arg:``/``aux:``
    keys, as ``Module.save_checkpoint``); returns the two paths."""
    import mxnet as mx
    sym_path, params_path = '%s-symbol.json' % prefix, '%s-%04d.params' % (prefix, epoch)
    sym.save(sym_path, remove_amp_cast=False)
    blob = {'arg:%s' % k: v for k, v in arg_params.items()}
    blob.update({'aux:%s' % k: v for k, v in aux_params.items()})
    mx.nd.save(params_path, blob)
    return sym_path, params_path


def strip_model(sym, arg_params, aux_params):
    """The float32 model: ``(remove_casts(sym), arg_params, aux_params)``, arrays in float32."""
    from ._src.graph.strip import remove_casts
    from ._src.graph.params import float32_arrays
    return remove_casts(sym), float32_arrays(arg_params), float32_arrays(aux_params)


def convert_model(sym, arg_params, aux_params, dtype, cast_params, emulate, data_names):
    """The mixed-precision model ``(graph, arg_params, aux_params)``: :func:`mxmp.convert_symbol`'s
    graph; arrays float32 except those the graph stores or pins (``__dtype__``) to another
    dtype, which plain MXNet needs in that dtype to bind.

    Raises:
        CLIError: the pass refused the graph (its ValueError's message).
    """
    from ._src.amp.convert_policy import cast_to_graph
    from ._src.graph.convert import convert_symbol
    from ._src.graph.params import arrays_for_graph, float32_arrays
    try:
        out = convert_symbol(sym, dtype, cast_params=cast_params, emulate=emulate,
                             data_names=data_names)
    except ValueError as err:
        raise CLIError(str(err)) from None
    arg_params = cast_to_graph(out, arrays_for_graph(out, arg_params, dtype))
    aux_params = cast_to_graph(out, float32_arrays(aux_params))
    return out, arg_params, aux_params


def fuse_model(sym, arg_params, aux_params, shapes, data_names):
    """``sym`` fused by MXNet's oneDNN backend for inference (:func:`mxmp._src.fusion.fuse_symbol`).

    Raises:
        CLIError: a data input without a shape in ``shapes``; the backend refused the graph.
    """
    import mxnet as mx
    from ._src.fusion import fuse_symbol
    if not all(n in shapes for n in data_names):
        raise CLIError('--fuse needs the shape of every data input to find the patterns: '
                       'add --shape %s=1,3,224,224 (your model\'s input shape; the fused '
                       'graph then runs any batch size)' % data_names[0])
    try:
        return fuse_symbol(sym, arg_params, aux_params, shapes=shapes)
    except mx.base.MXNetError as err:
        raise CLIError('oneDNN fusion refused this graph (%s); convert without --fuse'
                       % str(err).strip().splitlines()[0]) from None


def diagnose_batch(net, args, ctx):
    """The batch ``mxmp diagnose`` runs: ``(data, label, description)``.

    Args:
        net (gluon.Block): the float32 classifier (run once here, to check its output).
        args (argparse.Namespace): ``rec`` (image RecordIO file; else synthetic N(0, 1) data
            with random labels from ``seed``), ``batch_size``, ``data_shape``, ``mean_rgb``,
            ``std_rgb``.
        ctx (mxnet.Context): where the batch goes.

    Raises:
        CLIError: a missing RecordIO file; a model that cannot run on the batch or is not a
            classifier (output batch x classes); labels beyond the model's classes.
    """
    import mxnet as mx
    import numpy as np
    if args.rec:
        need_file(args.rec, 'RecordIO file')
        data, label = read_rec_batch(args.rec, args.batch_size, args.data_shape, args.mean_rgb,
                                     args.std_rgb, ctx)
        source = '%s (first %d images, %s)' % (args.rec, data.shape[0], 'x'.join(
            str(s) for s in data.shape[1:]))
    else:
        shape = args.data_shape or (3, 32, 32)
        rng = np.random.RandomState(args.seed)
        data = mx.nd.array(rng.normal(size=(args.batch_size,) + tuple(shape)), ctx=ctx)
        label = None
        source = 'synthetic N(0, 1) data %s' % 'x'.join(str(s) for s in data.shape)
    try:
        out = net(data)
    except mx.base.MXNetError as err:
        raise CLIError('the model cannot run on data of shape %s: %s (set --data-shape)'
                       % (data.shape, mxnet_error_line(err))) from None
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
    replaced by their data input (``sym`` itself if there is none): diagnose computes the loss
    itself, and a Module symbol's label is not a network input."""
    import mxnet as mx
    from ._src.diagnose.capture import output_names
    from ._src.policy.tables import classes_for
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
    """A saved graph (casts removed, loss heads stripped) and its parameters (any float dtype)
    as an initialized float32 ``gluon.SymbolBlock`` for :func:`mxmp.diagnose`.

    Raises:
        ValueError: ``sym`` has no input ``data_name``; a parameter of the graph is in neither
            dict.
    """
    import warnings
    import mxnet as mx
    import numpy as np
    from mxnet import gluon
    from ._src.graph.strip import remove_casts
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
    """(3, height, width) of the first image of the image RecordIO file ``rec``.

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
        raise ValueError('%s is not an image RecordIO file (%s)' % (rec, mxnet_error_line(err))) \
            from None
    if img is empty:
        raise ValueError('%s holds no record' % rec)
    if img is None:
        raise ValueError('%s: the first record is not an encoded image' % rec)
    return (3, img.shape[0], img.shape[1])


def read_rec_batch(rec, batch_size, data_shape=None, mean_rgb=(0, 0, 0), std_rgb=(1, 1, 1),
                   ctx=None):
    """The first ``batch_size`` images of ``rec`` (``ImageRecordIter``, no shuffling, wrapping
    around) and their labels; each channel becomes ``(pixel - mean) / std``, 0-255 scale;
    ``data_shape`` (C, H, W) defaults to the first record's.

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
        raise ValueError('cannot read %s: %s' % (rec, mxnet_error_line(err))) from None
    return batch.data[0].as_in_context(ctx), batch.label[0].as_in_context(ctx)


def cmd_convert(args):
    """mxmp convert: write a converted (or stripped) model."""
    import numpy as np
    from ._src.fusion import count_fused
    from ._src.graph.strip import count_casts
    if not args.strip and args.dtype is None:
        raise CLIError('give --dtype float16 or --dtype bfloat16 (or --strip to get the '
                       'float32 model back)')
    sym = load_symbol(args.symbol)
    data_names = tuple(args.data_name)
    arg_params, aux_params = load_params(args.params, sym, data_names)
    check_data_names(sym, data_names, arg_params)
    epoch = epoch_of(args.params) if args.epoch is None else args.epoch
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        raise CLIError('output directory %s does not exist' % out_dir)
    if args.strip:
        out, arg_params, aux_params = strip_model(sym, arg_params, aux_params)
        what = 'float32 (casts removed)'
    else:
        out, arg_params, aux_params = convert_model(sym, arg_params, aux_params, args.dtype,
                                                    args.cast_params, args.emulate, data_names)
        stored = sum(np.dtype(v.dtype) != np.float32
                     for v in list(arg_params.values()) + list(aux_params.values()))
        what = '%s%s, %d parameter(s) stored in %s' % (
            args.dtype, ' (emulated)' if args.emulate else '', stored, args.dtype)
    if args.fuse:
        out = fuse_model(out, arg_params, aux_params, dict(args.shape), data_names)
        what += '; fused for inference (%d oneDNN nodes)' % count_fused(out)
    sym_path, params_path = save_model(args.out, epoch, out, arg_params, aux_params)
    casts = count_casts(out)
    print('wrote %s and %s: %s; %d amp_cast, %d amp_multicast node(s)'
          % (sym_path, params_path, what, casts['amp_cast'], casts['amp_multicast']))
    return 0


def cmd_explain(args):
    """mxmp explain: the pass's decision for every node."""
    from ._src.graph.explain import explain, format_explain_table
    sym = load_symbol(args.symbol)
    try:
        rows = explain(sym, args.dtype, cast_params=args.cast_params,
                       data_names=tuple(args.data_name))
    except ValueError as err:
        raise CLIError(str(err)) from None
    if not args.all:
        rows = [r for r in rows if r.op != 'null']
    if args.json:
        print(json.dumps([{'node': r.name, 'op': r.op, 'dtype': r.dtype, 'rule': r.rule}
                          for r in rows], indent=1))
    else:
        print(format_explain_table(rows))
    return 0


def cmd_check_alignment(args):
    """mxmp check-alignment: Tensor Core alignment report."""
    import dataclasses
    from ._src.alignment import check_alignment, format_alignment
    sym = load_symbol(args.symbol)
    if not args.shape:
        raise CLIError('give the input shape(s), batch first: --shape data=32,3,224,224')
    try:
        rows = check_alignment(sym, dict(args.shape), multiple=args.multiple)
    except (ValueError, TypeError) as err:
        raise CLIError(mxnet_error_line(err)) from None
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in rows], indent=1))
    else:
        print(format_alignment(rows))
    return 1 if (rows and args.strict) else 0


def cmd_diagnose(args):
    """mxmp diagnose: the numerics report of a saved model on one batch."""
    import mxnet as mx
    from mxnet import gluon
    from ._src.diagnose.capture import diagnose
    if bool(args.rec) == bool(args.synthetic):
        raise CLIError('give either --rec FILE.rec (a batch of real images) or --synthetic')
    sym = load_symbol(args.symbol)
    arg_params, aux_params = load_params(args.params, sym, (args.data_name,))
    ctx = mx.cpu()
    net = float32_block(sym, arg_params, aux_params, args.data_name, ctx)
    data, label, source = diagnose_batch(net, args, ctx)
    print('diagnose: %s, %s, loss softmax cross-entropy' % (os.path.basename(args.symbol),
                                                            source))
    report = diagnose(net, data, label, gluon.loss.SoftmaxCrossEntropyLoss(),
                      target_dtype=args.dtype, steps=args.steps, learning_rate=args.lr,
                      underflow_tol=args.underflow_tol, verbose=False)
    print(report.table(flagged_only=args.flagged_only))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        paths = report.save_plots(args.out)
        with open(os.path.join(args.out, 'report.txt'), 'w') as f:
            f.write(report.table() + '\n')
        report.save_json(os.path.join(args.out, 'report.json'))
        print('wrote %s, %s, report.txt and report.json in %s'
              % (os.path.basename(paths['gradient_histogram']),
                 os.path.basename(paths['layer_ranges']), args.out))
    return 0


def cmd_plot(args):
    """mxmp plot: training curves of a metrics.jsonl file."""
    from ._src.plotting import plot_run
    need_file(args.metrics, 'metrics file')
    path = plot_run(args.metrics, args.out, title=args.title)   # creates --out's directory
    print('wrote %s' % path)
    return 0


def cmd_check_kernels(args):
    """mxmp check-kernels: the kernel conformance run."""
    from ._src.conformance.check import cmd
    return cmd(args)


_DTYPE_ALIASES = {'float16': 'float16', 'fp16': 'float16', 'half': 'float16',
                  'bfloat16': 'bfloat16', 'bf16': 'bfloat16'}
#: mean/std of Fashion-MNIST on the 0-255 scale (as examples/train_imagenet.py).
_FASHION_MNIST_MEAN, _FASHION_MNIST_STD = (72.94,) * 3, (90.02,) * 3


def _dtype(text):
    name = _DTYPE_ALIASES.get(str(text).lower())
    if name is None:
        raise argparse.ArgumentTypeError('unknown dtype %r: mxmp converts to float16 (NVIDIA '
                                         'GPUs) or bfloat16 (CPUs with oneDNN)' % text)
    return name


def _ints(text):
    try:
        values = tuple(int(v) for v in text.replace('x', ',').split(',') if v.strip())
    except ValueError:
        values = ()
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError('expected positive integers separated by commas, e.g. '
                                         '3,224,224; got %r' % text)
    return values


def _shape(text):
    name, sep, dims = text.partition('=')
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError('expected NAME=D1,D2,..., e.g. data=1,3,224,224; got %r'
                                         % text)
    return name.strip(), _ints(dims)


def _triple(text):
    try:
        values = tuple(float(v) for v in text.split(','))
    except ValueError:
        values = ()
    if len(values) == 1:
        values = values * 3
    if len(values) != 3:
        raise argparse.ArgumentTypeError('expected one number or three separated by commas, '
                                         'got %r' % text)
    return values


_FORMAT = argparse.ArgumentDefaultsHelpFormatter


#: Each subcommand's one-line help and its description (``mxmp SUBCOMMAND --help``).
_TEXTS = {
    'convert': ('write a mixed-precision (or, with --strip, float32) model',
                'Convert a float32 model to mixed precision for deployment: amp_cast nodes are '
                'kept in the written symbol (load it with gluon.SymbolBlock.imports or '
                'mx.mod.Module). --strip removes every cast and writes float32 parameters.'),
    'explain': ("print the pass's decision for every node",
                'Print the dtype the graph pass chooses for every node and the rule that chose it '
                '(node, op, dtype, rule).'),
    'check-alignment': ('Tensor Core alignment report (sizes not multiples of 8)',
                        'List the Convolution, Deconvolution and FullyConnected sizes that are not'
                        ' multiples of --multiple (8 for float16 Tensor Cores; NVIDIA Deep '
                        'Learning Performance guide).'),
    'diagnose': ('per-layer overflow/underflow report on one batch',
                 'Run a few float32 training iterations of a saved classifier on one batch and '
                 'report, per layer, the values that would overflow, become subnormal or flush to '
                 'zero in float16 / bfloat16, the loss scale that keeps the gradients in range and'
                 ' the layers to keep in float32 (docs/diagnose.md). Loss: softmax cross-entropy;'
                 ' a SoftmaxOutput head of a Module symbol is replaced by it.'),
    'plot': ('draw the training curves of a metrics.jsonl file',
             'Draw loss, accuracy, the loss-scale staircase (skipped steps marked) and the '
             'learning rate from the JSON-lines file the example scripts write '
             '(--save-dir/metrics.jsonl).'),
    'check-kernels': ("verify this machine's low-precision kernels op by op",
                      'Run every op the policy computes in low precision as a one-op graph, '
                      'forward and backward, each in its own subprocess, against float32 on the '
                      'same rounded inputs; print the table and write a report that '
                      'mxmp.Policy.from_kernel_report loads (see docs/conformance.md). Exit code 4'
                      ' if any op is wrong, crashed or failed.'),
}


def _subparser(sub, name, func):
    """A subcommand's parser, which runs ``func(args)``."""
    help_text, description = _TEXTS[name]
    parser = sub.add_parser(name, formatter_class=_FORMAT, help=help_text,
                            description=description)
    parser.set_defaults(func=func)
    return parser


def build_parser():
    """The argparse parser of the ``mxmp`` command (one subparser per subcommand)."""
    p = argparse.ArgumentParser(
        prog='mxmp', formatter_class=_FORMAT,
        description='Mixed precision (float16 / bfloat16) for Apache MXNet 1.x models saved as '
                    'prefix-symbol.json + prefix-NNNN.params.')
    sub = p.add_subparsers(dest='command', metavar='SUBCOMMAND')
    sub.required = True
    dtype_help = 'target dtype: float16 (NVIDIA GPUs) or bfloat16 (CPUs with oneDNN)'

    c = _subparser(sub, 'convert', cmd_convert)
    c.add_argument('symbol', help='prefix-symbol.json')
    c.add_argument('params', help='prefix-NNNN.params')
    c.add_argument('--dtype', type=_dtype, help=dtype_help + ' (required unless --strip)')
    c.add_argument('--out', required=True,
                   help='output prefix: writes OUT-symbol.json and OUT-NNNN.params')
    c.add_argument('--cast-params', action='store_true',
                   help='store the weights of low-precision layers in the target dtype (no '
                        'cast per call; BatchNorm statistics stay float32)')
    c.add_argument('--strip', action='store_true',
                   help='remove all casts (mxmp or mxnet.contrib.amp) and write float32')
    c.add_argument('--emulate', action='store_true',
                   help='emulated graph: float32 kernels with values rounded through the '
                        'target dtype (for CPUs without its kernels)')
    c.add_argument('--data-name', action='append', default=None,
                   help='name of a data input (repeatable); default: data')
    c.add_argument('--epoch', type=int, default=None,
                   help='number in the output params name; default: that of the input')
    c.add_argument('--fuse', action='store_true',
                   help="write the graph fused by MXNet's oneDNN backend (optimize_for('MKLDNN'): "
                        'Convolution+BatchNorm+ReLU as one node; the fastest CPU inference, '
                        'outputs within bfloat16 rounding of the unfused graph). Inference only; '
                        'loads in plain MXNet built with oneDNN (the pip wheels). Needs --shape')
    c.add_argument('--shape', type=_shape, action='append', default=[], metavar='NAME=DIMS',
                   help='shape of a data input for --fuse (repeatable), e.g. data=1,3,224,224')

    e = _subparser(sub, 'explain', cmd_explain)
    e.add_argument('symbol', help='prefix-symbol.json')
    e.add_argument('--dtype', type=_dtype, required=True, help=dtype_help)
    e.add_argument('--json', action='store_true', help='JSON list instead of a table')
    e.add_argument('--cast-params', action='store_true',
                   help='decide as convert --cast-params does')
    e.add_argument('--all', action='store_true', help='include variables (data, weights)')
    e.add_argument('--data-name', action='append', default=None,
                   help='name of a data input (repeatable); default: data')

    a = _subparser(sub, 'check-alignment', cmd_check_alignment)
    a.add_argument('symbol', help='prefix-symbol.json')
    a.add_argument('--shape', type=_shape, action='append', default=[], metavar='NAME=DIMS',
                   help='input shape, batch first, e.g. data=32,3,224,224 (repeatable)')
    a.add_argument('--multiple', type=int, default=8, help='alignment in elements')
    a.add_argument('--json', action='store_true', help='JSON list instead of a table')
    a.add_argument('--strict', action='store_true', help='exit code 1 if any size is misaligned')

    d = _subparser(sub, 'diagnose', cmd_diagnose)
    d.add_argument('symbol', help='prefix-symbol.json (float32 model)')
    d.add_argument('params', help='prefix-NNNN.params')
    d.add_argument('--rec', help='image RecordIO file (im2rec / prepare_fashion_mnist.py); the '
                                 'first --batch-size images are used')
    d.add_argument('--synthetic', action='store_true',
                   help='random N(0,1) images and random labels instead of --rec')
    d.add_argument('--batch-size', type=int, default=32)
    d.add_argument('--dtype', type=_dtype, default='bfloat16', help=dtype_help)
    d.add_argument('--out', help='directory for report.txt, report.json and the PNG plots '
                                 '(created if needed; the plots use --dtype\'s format)')
    d.add_argument('--steps', type=int, default=3, help='float32 iterations')
    d.add_argument('--lr', type=float, default=0.01,
                   help='SGD learning rate between iterations (on copies of the weights)')
    d.add_argument('--data-shape', type=_ints, default=None, metavar='C,H,W',
                   help='image shape fed to the model; default: that of the first record '
                        '(--rec) or 3,32,32 (--synthetic)')
    d.add_argument('--data-name', default='data', help='name of the data input')
    d.add_argument('--mean-rgb', type=_triple, default=_FASHION_MNIST_MEAN,
                   help='per-channel mean subtracted (0-255 scale); default Fashion-MNIST')
    d.add_argument('--std-rgb', type=_triple, default=_FASHION_MNIST_STD,
                   help='per-channel std divided by (0-255 scale); default Fashion-MNIST')
    d.add_argument('--underflow-tol', type=float, default=0.01,
                   help='flag a layer when more than this fraction of a tensor flushes to zero')
    d.add_argument('--flagged-only', action='store_true', help='print only the flagged layers')
    d.add_argument('--seed', type=int, default=0, help='seed of --synthetic data')

    t = _subparser(sub, 'plot', cmd_plot)
    t.add_argument('metrics', help='metrics.jsonl')
    t.add_argument('--out', default='curves.png',
                   help='output PNG (its directory is created if needed)')
    t.add_argument('--title', default=None,
                   help='figure title (default: the model and dtype of the run, from the '
                        'metrics file or the summary.json beside it)')

    k = _subparser(sub, 'check-kernels', cmd_check_kernels)
    k.add_argument('--dtype', type=_dtype, default='bfloat16', help=dtype_help)
    k.add_argument('--ops', default=None, help='comma-separated op names (default: every op '
                   'of the LOW_PRECISION, FOLLOW and WIDEST_TYPE classes)')
    k.add_argument('--out', default=None, help='write the JSON report here')
    k.add_argument('--emulate', choices=('auto', 'yes', 'no'), default='auto',
                   help='auto: real kernels, emulated graph where oneDNN has none on this CPU')
    k.add_argument('--jobs', type=int, default=2, help='subprocesses at once')
    k.add_argument('--timeout', type=float, default=90.0, help='seconds per op before "hang"')
    return p


def main(argv=None):
    """Run the ``mxmp`` command line.

    Args:
        argv (list of str): arguments without the program name; default ``sys.argv[1:]``.

    Returns:
        int: exit code: 0 success, 1 bad input (one line on stderr), 2 command-line syntax
        error (argparse), 3 unexpected error, 130 interrupted.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, 'data_name', None) is None:
        args.data_name = ['data']
    try:
        return int(args.func(args) or 0)
    except CLIError as err:
        msg = str(err)
    except FileNotFoundError as err:
        msg = 'no such file: %s' % (err.filename or mxnet_error_line(err))
    except (ValueError, TypeError, OSError, KeyError) as err:
        if os.environ.get('MXMP_DEBUG'):
            raise
        msg = mxnet_error_line(err)
    except KeyboardInterrupt:
        print('mxmp %s: interrupted' % args.command, file=sys.stderr)
        return 130
    except Exception as err:  # pylint: disable=broad-except
        if os.environ.get('MXMP_DEBUG'):
            raise
        print('mxmp %s: error: %s: %s (set MXMP_DEBUG=1 for the traceback)'
              % (args.command, type(err).__name__, mxnet_error_line(err)), file=sys.stderr)
        return 3
    print('mxmp %s: error: %s' % (args.command, _clean(msg)), file=sys.stderr)
    return 1


def _clean(msg):
    """One line, without MXNet's log prefixes ('[06:01:02] ../src/x.cc:151: ')."""
    msg = re.sub(r'\[\d\d:\d\d:\d\d\] \S+:\d+: ', '', msg)
    msg = msg.replace('MXNetError: ', '').replace('Check failed: ', '')
    return ' '.join(msg.split())


if __name__ == '__main__':
    sys.exit(main())
