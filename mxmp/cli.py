"""The ``mxmp`` command: convert, explain, check-alignment, diagnose, plot, check-kernels.

``mxmp SUBCOMMAND --help`` (or ``python -m mxmp.cli``) documents each subcommand; docs/cli.md
gives examples. Bad input raises :class:`CLIError`, which :func:`main` prints as one line
``mxmp SUBCOMMAND: error: ...`` on stderr, exit code 1; every input and output path is checked
before the work starts. Exit codes: :data:`EXIT_CODES`.
"""
import argparse
import collections
import json
import os
import re
import sys

from ._src.errors import CLIError, mxnet_error_line
from ._src.cli_types import (FASHION_MNIST_MEAN, FASHION_MNIST_STD, dtype, ints, number, shape,
                             triple)
from ._src.files import write_atomic
from ._src.model_io import (check_data_names, check_out_path, convert_model, diagnose_batch,
                            epoch_of, float32_block, fold_model, fuse_model, load_params,
                            load_symbol, need_file, save_model)

#: The exit codes of :func:`main` (docs/cli.md).
EXIT_CODES = {0: 'success (the model is fine)', 1: 'bad input: a file, a name or an option',
              2: 'command-line syntax (argparse)', 3: 'unexpected error (MXMP_DEBUG=1 for the '
              'traceback)', 4: 'the check found something: check-alignment --strict found a '
              'misaligned size, check-kernels an op wrong, crashed or failed', 130: 'interrupted'}
#: The exit code of a check that ran on good input and found something.
FOUND = 4


def cmd_convert(args):
    """mxmp convert: write a converted (or stripped) model."""
    import numpy as np
    from ._src.fused_inference import count_fused
    from ._src.graph.strip import count_casts, float32_arrays, remove_casts
    if not args.strip and args.dtype is None:
        raise CLIError('give --dtype float16 or --dtype bfloat16 (or --strip to get the '
                       'float32 model back)')
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        raise CLIError('output directory %s does not exist' % out_dir)
    data_names = tuple(args.data_name)
    _check_shape_names(args.shape, data_names)
    sym = load_symbol(args.symbol)
    arg_params, aux_params = load_params(args.params, sym, data_names)
    check_data_names(sym, data_names, arg_params)
    epoch = epoch_of(args.params) if args.epoch is None else args.epoch
    if args.strip:
        out = remove_casts(sym)
        arg_params, aux_params = float32_arrays(arg_params), float32_arrays(aux_params)
        what = 'float32 (casts removed)'
    else:
        if args.fuse and args.fold_batchnorm:
            sym, arg_params, aux_params = fold_model(sym, arg_params, aux_params)
        out, arg_params, aux_params = convert_model(sym, arg_params, aux_params, args.dtype,
                                                    args.cast_params, args.emulate, data_names,
                                                    args.library_ops)
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


def _check_shape_names(shapes, data_names):
    """CLIError if a ``--shape NAME=...`` names no input of ``data_names`` (--data-name)."""
    unknown = [n for n, _ in shapes if n not in data_names]
    if unknown:
        raise CLIError('--shape %s: %s is not a data input given with --data-name (%s)'
                       % (unknown[0], unknown[0], ', '.join(data_names) or 'none'))


def cmd_explain(args):
    """mxmp explain: the pass's decision for every node."""
    from ._src.graph.plan import explain
    sym = load_symbol(args.symbol)
    check_data_names(sym, tuple(args.data_name))
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
        print(_explain_table(rows))
    return 0


def _explain_table(rows):
    """:func:`explain` rows as an aligned table (node, op, dtype, rule) and a line counting the
    nodes per dtype (variables are not counted); str without a trailing newline."""
    table = [('node', 'op', 'dtype', 'rule')] + [
        (r.name, r.op if r.op != 'null' else 'variable', r.dtype or '-', r.rule) for r in rows]
    widths = [max(len(t[i]) for t in table) for i in range(3)]
    lines = ['  '.join(c.ljust(w) for c, w in zip(line[:3], widths)) + '  ' + line[3]
             for line in table]
    lines.insert(1, '  '.join('-' * w for w in widths) + '  ' + '-' * 4)
    counts = collections.Counter(r.dtype for r in rows if r.op != 'null')
    lines.append('%d node(s): %s' % (sum(counts.values()), ', '.join(
        '%d in %s' % (n, d or 'no float dtype')
        for d, n in sorted(counts.items(), key=lambda kv: str(kv[0])))))
    return '\n'.join(lines)


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
    return FOUND if (rows and args.strict) else 0


def cmd_diagnose(args):
    """mxmp diagnose: the numerics report of a saved model on one batch."""
    import mxnet as mx
    from mxnet import gluon
    from ._src.diagnose.capture import diagnose
    if bool(args.rec) == bool(args.synthetic):
        raise CLIError('give either --rec FILE.rec (a batch of real images) or --synthetic')
    names = tuple(args.data_name)
    _check_shape_names(args.shape, names[1:])
    unshaped = [n for n in names[1:] if n not in dict(args.shape)]
    if unshaped:
        raise CLIError('the first --data-name gets the images; give the shape of each other '
                       'input without the batch size (synthetic N(0, 1) values): --shape '
                       '%s=DIMS' % unshaped[0])
    if args.rec:
        need_file(args.rec, 'RecordIO file')
    if args.out:
        check_out_path(args.out, 'output directory', directory=True, create=True)
    sym = load_symbol(args.symbol)
    arg_params, aux_params = load_params(args.params, sym, names)
    check_data_names(sym, names, arg_params)
    ctx = mx.cpu()
    net = float32_block(sym, arg_params, aux_params, names, ctx)
    data, label, source = diagnose_batch(net, args, ctx)
    print('diagnose: %s, %s, loss softmax cross-entropy' % (os.path.basename(args.symbol),
                                                            source))
    report = diagnose(net, data, label, gluon.loss.SoftmaxCrossEntropyLoss(),
                      target_dtype=args.dtype, steps=args.steps, learning_rate=args.lr,
                      underflow_tol=args.underflow_tol, data_names=names, verbose=False)
    print(report.table(flagged_only=args.flagged_only))
    if args.out:
        paths = report.save_plots(args.out)   # creates args.out
        write_atomic(os.path.join(args.out, 'report.txt'), report.table() + '\n')
        report.save_json(os.path.join(args.out, 'report.json'))
        print('wrote %s, %s, report.txt and report.json in %s'
              % (os.path.basename(paths['gradient_histogram']),
                 os.path.basename(paths['layer_ranges']), args.out))
    return 0


def cmd_plot(args):
    """mxmp plot: training curves of a metrics.jsonl file."""
    from ._src.plotting import plot_run
    need_file(args.metrics, 'metrics file')
    check_out_path(args.out, 'output file', create=True)
    path = plot_run(args.metrics, args.out, title=args.title)   # creates --out's directory
    print('wrote %s' % path)
    return 0


def cmd_check_kernels(args):
    """mxmp check-kernels: the kernel conformance run; exit code 4 if an op failed."""
    from ._src.conformance.check import check_kernels
    from ._src.policy.kernel_report import _BAD, _kind
    if args.out:
        check_out_path(args.out, 'report file')
    ops = [o.strip() for o in args.ops.split(',') if o.strip()] if args.ops else None
    emulate = {'auto': None, 'yes': True, 'no': False}[args.emulate]
    report = check_kernels(args.dtype, ops=ops, emulate=emulate, jobs=args.jobs,
                           timeout=args.timeout)
    print(report.table())
    if args.out:
        report.save(args.out)
        print('report written to %s; use it with mxmp.Policy.from_kernel_report(%r)'
              % (args.out, args.out))
    return FOUND if any(_kind(v) in _BAD for v in report.verdicts().values()) else 0


_FORMAT = argparse.ArgumentDefaultsHelpFormatter


def _subparser(sub, name, func, help_text, description, files=()):
    """A subcommand's parser, which runs ``func(args)``, with the positional model files
    ``files`` (``'symbol'``, ``'params'``)."""
    parser = sub.add_parser(name, formatter_class=_FORMAT, help=help_text,
                            description=description)
    parser.set_defaults(func=func)
    for positional in files:
        parser.add_argument(positional, help=_FILE_HELP[positional])
    return parser


_FILE_HELP = {'symbol': 'prefix-symbol.json', 'params': 'prefix-NNNN.params'}


def build_parser():
    """The argparse parser of the ``mxmp`` command (one subparser per subcommand)."""
    p = argparse.ArgumentParser(
        prog='mxmp', formatter_class=_FORMAT,
        description='Mixed precision (float16 / bfloat16) for Apache MXNet 1.x models saved as '
                    'prefix-symbol.json + prefix-NNNN.params.')
    sub = p.add_subparsers(dest='command', metavar='SUBCOMMAND')
    sub.required = True
    dtype_help = 'target dtype: float16 (NVIDIA GPUs) or bfloat16 (CPUs with oneDNN)'

    c = _subparser(sub, 'convert', cmd_convert,
                   'write a mixed-precision (or, with --strip, float32) model',
                   'Convert a float32 model to mixed precision for deployment: amp_cast nodes are'
                   ' kept in the written symbol (load it with gluon.SymbolBlock.imports or '
                   'mx.mod.Module). --strip removes every cast and writes float32 parameters.',
                   files=('symbol', 'params'))
    c.add_argument('--dtype', type=dtype, help=dtype_help + ' (required unless --strip)')
    c.add_argument('--out', required=True,
                   help='output prefix: writes OUT-symbol.json and OUT-NNNN.params')
    c.add_argument('--cast-params', action='store_true',
                   help='store low-precision weights in the target dtype (BatchNorm: float32)')
    c.add_argument('--strip', action='store_true',
                   help='remove all casts (mxmp or mxnet.contrib.amp) and write float32')
    c.add_argument('--emulate', action='store_true',
                   help='float32 kernels, values rounded to the target dtype (CPUs without its)')
    c.add_argument('--data-name', action='append', default=None,
                   help='name of a data input (repeatable); default: data')
    c.add_argument('--library-ops', action='store_true', help="keep mxmp's library ops (then "
                   "the graph loads after `import mxmp` only); default: MXNet's own ops")
    c.add_argument('--epoch', type=number(int, 0), default=None,
                   help='number in the output params name; default: that of the input')
    c.add_argument('--fuse', action='store_true',
                   help="write the graph fused by MXNet's oneDNN backend (optimize_for('MKLDNN'): "
                        'Convolution+BatchNorm+ReLU as one node; the fastest CPU inference, within '
                        'bfloat16 rounding of the unfused graph). Inference only; loads in plain '
                        'MXNet built with oneDNN (the pip wheels). Needs --shape')
    c.add_argument('--no-fold-batchnorm', dest='fold_batchnorm', action='store_false',
                   help='--fuse: MXNet folds BatchNorm (truncated to bfloat16), not mxmp (float32)')
    c.add_argument('--shape', type=shape, action='append', default=[], metavar='NAME=DIMS',
                   help='shape of a data input for --fuse (repeatable), e.g. data=1,3,224,224')

    e = _subparser(sub, 'explain', cmd_explain, "print the pass's decision for every node",
                   'Print the dtype the graph pass chooses for every node and the rule that chose'
                   ' it (node, op, dtype, rule).', files=('symbol',))
    e.add_argument('--dtype', type=dtype, required=True, help=dtype_help)
    e.add_argument('--json', action='store_true', help='JSON list instead of a table')
    e.add_argument('--cast-params', action='store_true',
                   help='decide as convert --cast-params does')
    e.add_argument('--all', action='store_true', help='include variables (data, weights)')
    e.add_argument('--data-name', action='append', default=None,
                   help='name of a data input (repeatable); default: data')

    a = _subparser(sub, 'check-alignment', cmd_check_alignment,
                   'Tensor Core alignment report (sizes not multiples of 8)',
                   'List the Convolution, Deconvolution and FullyConnected sizes that are not '
                   'multiples of --multiple (8 for float16 Tensor Cores; NVIDIA Deep Learning '
                   'Performance guide).', files=('symbol',))
    a.add_argument('--shape', type=shape, action='append', default=[], metavar='NAME=DIMS',
                   help='input shape, batch first, e.g. data=32,3,224,224 (repeatable)')
    a.add_argument('--multiple', type=number(int, 1), default=8, help='alignment in elements')
    a.add_argument('--json', action='store_true', help='JSON list instead of a table')
    a.add_argument('--strict', action='store_true',
                   help='exit code 4 (the check found something) if any size is misaligned')

    d = _subparser(sub, 'diagnose', cmd_diagnose,
                   'per-layer overflow/underflow report on one batch',
                   'Run a few float32 training iterations of a saved classifier on one batch and '
                   'report, per layer, the values that would overflow, become subnormal or flush '
                   'to zero in float16 / bfloat16, the loss scale that keeps the gradients in '
                   'range and the layers to keep in float32 (docs/diagnose.md). Loss: softmax '
                   'cross-entropy; a SoftmaxOutput head of a Module symbol is replaced by it.',
                   files=('symbol', 'params'))
    d.add_argument('--rec', help='image RecordIO file (im2rec / prepare_fashion_mnist.py); the '
                                 'first --batch-size images are used')
    d.add_argument('--synthetic', action='store_true',
                   help='random N(0,1) images and random labels instead of --rec')
    d.add_argument('--batch-size', type=number(int, 1), default=32)
    d.add_argument('--dtype', type=dtype, default='bfloat16', help=dtype_help)
    d.add_argument('--out', help='directory for report.txt, report.json and the PNG plots '
                                 '(created if needed; the plots use --dtype\'s format)')
    d.add_argument('--steps', type=number(int, 1), default=3, help='float32 iterations')
    d.add_argument('--lr', type=number(float, 0.0), default=0.01,
                   help='SGD learning rate between iterations (on copies of the weights)')
    d.add_argument('--data-shape', type=ints, default=None, metavar='C,H,W',
                   help='image shape fed to the model; default: that of the first record '
                        '(--rec) or 3,32,32 (--synthetic)')
    d.add_argument('--data-name', action='append', default=None,
                   help='name of a data input (repeatable; the first gets the images); '
                        'default: data')
    d.add_argument('--shape', type=shape, action='append', default=[], metavar='NAME=DIMS',
                   help='shape without the batch size of each data input after the first '
                        '(synthetic N(0, 1) values), e.g. mask=16 (repeatable)')
    d.add_argument('--mean-rgb', type=triple, default=FASHION_MNIST_MEAN,
                   help='per-channel mean subtracted (0-255 scale); default Fashion-MNIST')
    d.add_argument('--std-rgb', type=triple, default=FASHION_MNIST_STD,
                   help='per-channel std divided by (0-255 scale); default Fashion-MNIST')
    d.add_argument('--underflow-tol', type=number(float, 0.0, 1.0), default=0.01,
                   help='flag a layer when more than this fraction of a tensor flushes to zero')
    d.add_argument('--flagged-only', action='store_true', help='print only the flagged layers')
    d.add_argument('--seed', type=number(int, 0, 2 ** 32 - 1), default=0, help='seed of --synthetic data')

    t = _subparser(sub, 'plot', cmd_plot, 'draw the training curves of a metrics.jsonl file',
                   'Draw loss, accuracy, the loss-scale staircase (skipped steps marked) and the '
                   'learning rate from the JSON-lines file the example scripts write ('
                   '--save-dir/metrics.jsonl).')
    t.add_argument('metrics', help='metrics.jsonl')
    t.add_argument('--out', default='curves.png',
                   help='output PNG (its directory is created if needed)')
    t.add_argument('--title', default=None,
                   help='figure title (default: the model and dtype of the run, from the '
                        'metrics file or the summary.json beside it)')

    k = _subparser(sub, 'check-kernels', cmd_check_kernels,
                   "verify this machine's low-precision kernels op by op",
                   'Run every op the policy computes in low precision as a one-op graph, forward '
                   'and backward, each in its own subprocess, against float32 on the same rounded'
                   ' inputs; print the table and write a report that '
                   'mxmp.Policy.from_kernel_report loads (see docs/conformance.md). Exit code 4 '
                   'if any op is wrong, crashed or failed.')
    k.add_argument('--dtype', type=dtype, default='bfloat16', help=dtype_help)
    k.add_argument('--ops', default=None, help='comma-separated op names (default: every op '
                   'of the LOW_PRECISION, FOLLOW and WIDEST_TYPE classes)')
    k.add_argument('--out', default=None, help='write the JSON report here')
    k.add_argument('--emulate', choices=('auto', 'yes', 'no'), default='auto',
                   help='auto: real kernels, emulated graph where oneDNN has none on this CPU')
    k.add_argument('--jobs', type=number(int, 1), default=2, help='subprocesses at once')
    k.add_argument('--timeout', type=number(float, 0.0, low_open=True), default=90.0, help='seconds per op before "hang"')
    return p


def main(argv=None):
    """Run the ``mxmp`` command line.

    Args:
        argv (list of str): arguments without the program name; default ``sys.argv[1:]``.

    Returns:
        int: exit code (:data:`EXIT_CODES`): 0 success, 1 bad input (one line on stderr), 2
        command-line syntax error (argparse), 3 unexpected error, 4 the check found something
        (check-alignment --strict, check-kernels), 130 interrupted.
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
