"""The ``mxmp`` command line: convert, explain, check-alignment, diagnose, plot.

Subcommands (``mxmp SUBCOMMAND --help`` for each)::

    mxmp convert model-symbol.json model-0000.params --dtype bfloat16 --out model-bf16
    mxmp convert model-bf16-symbol.json model-bf16-0000.params --strip --out model-fp32
    mxmp explain model-symbol.json --dtype float16 [--json]
    mxmp check-alignment model-symbol.json --shape data=32,3,224,224
    mxmp diagnose model-symbol.json model-0000.params --rec val.rec [--dtype float16] [--out dir]
    mxmp diagnose model-symbol.json model-0000.params --synthetic --data-shape 3,32,32
    mxmp plot runs/bf16/metrics.jsonl --out curves.png

Models are the two files that ``HybridBlock.export(prefix)`` and ``Module.save_checkpoint``
write: ``prefix-symbol.json`` and ``prefix-NNNN.params`` (keys ``arg:name``/``aux:name``;
files from ``save_parameters`` without the prefixes are accepted too).

Bad input (a missing file, a file that is not a symbol or params file, a symbol and params that
do not belong together, an unknown dtype) ends with one line ``mxmp SUBCOMMAND: error: ...`` on
stderr and exit code 1 (2 for command-line syntax errors, from argparse), never a traceback.
Set ``MXMP_DEBUG=1`` to get the traceback of an unexpected error.

The console entry point is ``mxmp = mxmp.cli:main``; ``python -m mxmp.cli`` works too.
"""
import argparse
import json
import os
import re
import sys

# MXNet logs "Subgraph backend MKLDNN is activated." on every bind; keep the output clean.
os.environ.setdefault('MXNET_SUBGRAPH_VERBOSE', '0')

from .errors import CLIError, mxnet_error_line

__all__ = ['main', 'build_parser', 'CLIError']

_DTYPE_ALIASES = {'float16': 'float16', 'fp16': 'float16', 'half': 'float16',
                  'bfloat16': 'bfloat16', 'bf16': 'bfloat16'}
#: mean/std of Fashion-MNIST on the 0-255 scale (as examples/train_imagenet.py).
_FASHION_MNIST_MEAN, _FASHION_MNIST_STD = (72.94,) * 3, (90.02,) * 3


# ---------------------------------------------------------------------------------------------
# argument types
# ---------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------
# loading models
# ---------------------------------------------------------------------------------------------
def _need_file(path, what):
    if not os.path.exists(path):
        raise CLIError('%s %s does not exist' % (what, path))
    if not os.path.isfile(path):
        raise CLIError('%s %s is not a file' % (what, path))


def load_symbol(path):
    """Load ``path`` as an MXNet Symbol; CLIError naming the problem otherwise."""
    import mxnet as mx
    _need_file(path, 'symbol file')
    try:
        with open(path) as f:
            json.load(f)
    except (ValueError, UnicodeDecodeError) as err:
        raise CLIError('%s is not a symbol JSON file (%s); pass the prefix-symbol.json that '
                       'HybridBlock.export() writes' % (path, mxnet_error_line(err))) from None
    try:
        return mx.sym.load(path)
    except mx.base.MXNetError as err:
        raise CLIError('%s is not an MXNet symbol file: %s' % (path, mxnet_error_line(err))) from None


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
    _need_file(path, 'params file')
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


def _epoch_of(params_path):
    m = re.search(r'-(\d+)\.params$', params_path)
    return int(m.group(1)) if m else 0


def _save_params(path, arg_params, aux_params):
    import mxnet as mx
    blob = {'arg:%s' % k: v for k, v in arg_params.items()}
    blob.update({'aux:%s' % k: v for k, v in aux_params.items()})
    mx.nd.save(path, blob)


# ---------------------------------------------------------------------------------------------
# subcommands
# ---------------------------------------------------------------------------------------------
def cmd_convert(args):
    """mxmp convert: write a converted (or stripped) model."""
    import mxnet as mx
    import numpy as np
    from .graph import MARK, convert_symbol, count_casts, remove_casts
    from .gluon import dtype_of
    if not args.strip and args.dtype is None:
        raise CLIError('give --dtype float16 or --dtype bfloat16 (or --strip to get the '
                       'float32 model back)')
    sym = load_symbol(args.symbol)
    data_names = tuple(args.data_name)
    arg_params, aux_params = load_params(args.params, sym, data_names)
    unknown = [n for n in data_names if n not in sym.list_arguments()]
    if unknown:
        raise CLIError('the symbol has no input named %s; its inputs are %s'
                       % (', '.join(unknown), ', '.join(
                           n for n in sym.list_arguments() if n not in arg_params)))
    epoch = _epoch_of(args.params) if args.epoch is None else args.epoch
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        raise CLIError('output directory %s does not exist' % out_dir)

    def to_float32(a):
        if np.dtype(a.dtype) == np.float32:
            return a
        return mx.nd.amp_cast(a, dtype='float32')

    if args.strip:
        out = remove_casts(sym)
        arg_params = {k: to_float32(v) for k, v in arg_params.items()}
        aux_params = {k: to_float32(v) for k, v in aux_params.items()}
        what = 'float32 (casts removed)'
    else:
        try:
            out = convert_symbol(sym, args.dtype, cast_params=args.cast_params,
                                 emulate=args.emulate, data_names=data_names)
        except ValueError as err:
            raise CLIError(str(err)) from None
        lowp = {n['name'] for n in json.loads(out.tojson(remove_amp_cast=False))['nodes']
                if n['op'] == 'null' and n.get('attrs', {}).get(MARK, '').startswith('cast_param')}
        target = dtype_of(args.dtype)
        arg_params = {k: mx.nd.amp_cast(to_float32(v), dtype=target) if k in lowp
                      else to_float32(v) for k, v in arg_params.items()}
        # Variables the graph pins to a dtype (``__dtype__``, e.g. contrib.amp's
        # cast_optional_params=True) need arrays of that dtype, or plain MXNet cannot bind
        # (SymbolBlock.imports, Symbol.bind: "Incompatible attr ... expected bfloat16, got
        # float32").
        from .amp.convert_policy import cast_to_graph
        arg_params = cast_to_graph(out, arg_params)
        aux_params = cast_to_graph(out, {k: to_float32(v) for k, v in aux_params.items()})
        stored = sum(np.dtype(v.dtype) != np.float32
                     for v in list(arg_params.values()) + list(aux_params.values()))
        what = '%s%s, %d parameter(s) stored in %s' % (
            args.dtype, ' (emulated)' if args.emulate else '', stored, args.dtype)
    if args.fuse:
        from .fusion import count_fused, fuse_symbol
        shapes = dict(args.shape)
        if not all(n in shapes for n in data_names):
            raise CLIError('--fuse needs the shape of every data input to find the patterns: '
                           'add --shape %s=1,3,224,224 (your model\'s input shape; the fused '
                           'graph then runs any batch size)' % data_names[0])
        try:
            out = fuse_symbol(out, arg_params, aux_params, shapes=shapes)
        except mx.base.MXNetError as err:
            raise CLIError('oneDNN fusion refused this graph (%s); convert without --fuse'
                           % str(err).strip().splitlines()[0]) from None
        what += '; fused for inference (%d oneDNN nodes)' % count_fused(out)
    sym_path, params_path = '%s-symbol.json' % args.out, '%s-%04d.params' % (args.out, epoch)
    out.save(sym_path, remove_amp_cast=False)
    _save_params(params_path, arg_params, aux_params)
    casts = count_casts(out)
    print('wrote %s and %s: %s; %d amp_cast, %d amp_multicast node(s)'
          % (sym_path, params_path, what, casts['amp_cast'], casts['amp_multicast']))
    return 0


def cmd_explain(args):
    """mxmp explain: the pass's decision for every node."""
    from .graph import explain
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
        return 0
    table = [('node', 'op', 'dtype', 'rule')] + [
        (r.name, r.op if r.op != 'null' else 'variable', r.dtype or '-', r.rule) for r in rows]
    widths = [max(len(t[i]) for t in table) for i in range(3)]
    for k, line in enumerate(table):
        print('  '.join(c.ljust(w) for c, w in zip(line[:3], widths)) + '  ' + line[3])
        if k == 0:
            print('  '.join('-' * w for w in widths) + '  ' + '-' * 4)
    counts = {}
    for r in rows:
        if r.op != 'null':
            counts[r.dtype] = counts.get(r.dtype, 0) + 1
    print('%d node(s): %s' % (sum(counts.values()), ', '.join(
        '%d in %s' % (n, d or 'no float dtype') for d, n in sorted(counts.items(),
                                                                    key=lambda kv: str(kv[0])))))
    return 0


def cmd_check_alignment(args):
    """mxmp check-alignment: Tensor Core alignment report."""
    import dataclasses
    from .alignment import check_alignment, format_alignment
    sym = load_symbol(args.symbol)
    if not args.shape:
        raise CLIError('give the input shape(s), batch first: --shape data=32,3,224,224')
    shapes = dict(args.shape)
    try:
        rows = check_alignment(sym, shapes, multiple=args.multiple)
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
    import numpy as np
    from mxnet import gluon
    from .diagnose import diagnose
    from .diagnose.inputs import float32_block, read_rec_batch
    if bool(args.rec) == bool(args.synthetic):
        raise CLIError('give either --rec FILE.rec (a batch of real images) or --synthetic')
    sym = load_symbol(args.symbol)
    data_name = args.data_name
    arg_params, aux_params = load_params(args.params, sym, (data_name,))
    ctx = mx.cpu()
    net = float32_block(sym, arg_params, aux_params, data_name, ctx)
    if args.rec:
        _need_file(args.rec, 'RecordIO file')
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
    from .plotting import plot_run
    _need_file(args.metrics, 'metrics file')
    path = plot_run(args.metrics, args.out, title=args.title)   # creates --out's directory
    print('wrote %s' % path)
    return 0


# ---------------------------------------------------------------------------------------------
# parser and entry point
# ---------------------------------------------------------------------------------------------
def build_parser():
    """The argparse parser of the ``mxmp`` command (one subparser per subcommand)."""
    fmt = argparse.ArgumentDefaultsHelpFormatter
    p = argparse.ArgumentParser(
        prog='mxmp', formatter_class=fmt,
        description='Mixed precision (float16 / bfloat16) for Apache MXNet 1.x models saved as '
                    'prefix-symbol.json + prefix-NNNN.params.')
    sub = p.add_subparsers(dest='command', metavar='SUBCOMMAND')
    sub.required = True
    dtype_help = 'target dtype: float16 (NVIDIA GPUs) or bfloat16 (CPUs with oneDNN)'

    c = sub.add_parser('convert', formatter_class=fmt,
                       help='write a mixed-precision (or, with --strip, float32) model',
                       description='Convert a float32 model to mixed precision for deployment: '
                                   'amp_cast nodes are kept in the written symbol (load it '
                                   'with gluon.SymbolBlock.imports or mx.mod.Module). --strip '
                                   'removes every cast and writes float32 parameters.')
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
    c.set_defaults(func=cmd_convert)

    e = sub.add_parser('explain', formatter_class=fmt,
                       help="print the pass's decision for every node",
                       description='Print the dtype the graph pass chooses for every node and '
                                   'the rule that chose it (node, op, dtype, rule).')
    e.add_argument('symbol', help='prefix-symbol.json')
    e.add_argument('--dtype', type=_dtype, required=True, help=dtype_help)
    e.add_argument('--json', action='store_true', help='JSON list instead of a table')
    e.add_argument('--cast-params', action='store_true',
                   help='decide as convert --cast-params does')
    e.add_argument('--all', action='store_true', help='include variables (data, weights)')
    e.add_argument('--data-name', action='append', default=None,
                   help='name of a data input (repeatable); default: data')
    e.set_defaults(func=cmd_explain)

    a = sub.add_parser('check-alignment', formatter_class=fmt,
                       help='Tensor Core alignment report (sizes not multiples of 8)',
                       description='List the Convolution, Deconvolution and FullyConnected '
                                   'sizes that are not multiples of --multiple (8 for float16 '
                                   'Tensor Cores; NVIDIA Deep Learning Performance guide).')
    a.add_argument('symbol', help='prefix-symbol.json')
    a.add_argument('--shape', type=_shape, action='append', default=[], metavar='NAME=DIMS',
                   help='input shape, batch first, e.g. data=32,3,224,224 (repeatable)')
    a.add_argument('--multiple', type=int, default=8, help='alignment in elements')
    a.add_argument('--json', action='store_true', help='JSON list instead of a table')
    a.add_argument('--strict', action='store_true', help='exit code 1 if any size is misaligned')
    a.set_defaults(func=cmd_check_alignment)

    d = sub.add_parser('diagnose', formatter_class=fmt,
                       help='per-layer overflow/underflow report on one batch',
                       description='Run a few float32 training iterations of a saved classifier '
                                   'on one batch and report, per layer, the values that would '
                                   'overflow, become subnormal or flush to zero in float16 / '
                                   'bfloat16, the loss scale that keeps the gradients in range '
                                   'and the layers to keep in float32 (see mxmp.diagnose). '
                                   'Loss: softmax cross-entropy; a SoftmaxOutput head of a '
                                   'Module symbol is replaced by it.')
    d.add_argument('symbol', help='prefix-symbol.json (float32 model)')
    d.add_argument('params', help='prefix-NNNN.params')
    d.add_argument('--rec', help='image RecordIO file (im2rec / prepare_fashion_mnist.py); the '
                                 'first --batch-size images are used')
    d.add_argument('--synthetic', action='store_true',
                   help='random N(0,1) images and random labels instead of --rec')
    d.add_argument('--batch-size', type=int, default=32)
    d.add_argument('--dtype', type=_dtype, default='float16', help=dtype_help)
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
    d.set_defaults(func=cmd_diagnose)

    t = sub.add_parser('plot', formatter_class=fmt,
                       help='draw the training curves of a metrics.jsonl file',
                       description='Draw loss, accuracy, the loss-scale staircase (skipped '
                                   'steps marked) and the learning rate from the JSON-lines '
                                   'file the example scripts write (--save-dir/metrics.jsonl).')
    t.add_argument('metrics', help='metrics.jsonl')
    t.add_argument('--out', default='curves.png',
                   help='output PNG (its directory is created if needed)')
    t.add_argument('--title', default=None,
                   help='figure title (default: the model and dtype of the run, from the '
                        'metrics file or the summary.json beside it)')
    t.set_defaults(func=cmd_plot)

    k = sub.add_parser('check-kernels', formatter_class=fmt,
                       help="verify this machine's low-precision kernels op by op",
                       description='Run every op the policy computes in low precision as a '
                                   'one-op graph, forward and backward, each in its own '
                                   'subprocess, against float32 on the same rounded inputs; '
                                   'print the table and write a report that '
                                   'mxmp.Policy.from_kernel_report loads (see '
                                   'docs/conformance.md). Exit code 4 if any op is wrong, '
                                   'crashed or failed.')
    k.add_argument('--dtype', type=_dtype, default='bfloat16', help=dtype_help)
    k.add_argument('--ops', default=None, help='comma-separated op names (default: every op '
                   'of the LOW_PRECISION, FOLLOW and WIDEST_TYPE classes)')
    k.add_argument('--out', default=None, help='write the JSON report here')
    k.add_argument('--emulate', choices=('auto', 'yes', 'no'), default='auto',
                   help='auto: real kernels, emulated graph where oneDNN has none on this CPU')
    k.add_argument('--jobs', type=int, default=2, help='subprocesses at once')
    k.add_argument('--timeout', type=float, default=90.0, help='seconds per op before "hang"')
    k.set_defaults(func=lambda args: __import__('mxmp.conformance').conformance.cmd(args))
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
