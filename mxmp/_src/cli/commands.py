"""The ``mxmp`` subcommands: each reads its parsed arguments, calls the library and prints.

The work is in the library (:mod:`mxmp._src.cli.model_io` for the model files and the diagnose
batch, :mod:`mxmp._src.graph`, :mod:`mxmp._src.alignment`, :mod:`mxmp._src.diagnose`, :mod:`mxmp._src.plotting`);
a user error raises :class:`mxmp._src.errors.CLIError`, which :func:`mxmp._src.cli.main` prints as one
line. Each returns the exit code.
"""
import json
import os

from ..errors import CLIError, mxnet_error_line
from .model_io import (check_data_names, convert_model, diagnose_batch, epoch_of, fuse_model,
    load_params, load_symbol, need_file, save_model, strip_model)

__all__ = ['cmd_convert', 'cmd_explain', 'cmd_check_alignment', 'cmd_diagnose', 'cmd_plot',
           'cmd_check_kernels']


def cmd_convert(args):
    """mxmp convert: write a converted (or stripped) model."""
    import numpy as np
    from ..gluon_graph import count_fused
    from ..graph.strip import count_casts
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
    from ..graph.plan import explain, format_explain_table
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
    from ..alignment import check_alignment, format_alignment
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
    from ..diagnose.capture import diagnose
    from ..diagnose.inputs import float32_block
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
    from ..plotting.run_curves import plot_run
    need_file(args.metrics, 'metrics file')
    path = plot_run(args.metrics, args.out, title=args.title)   # creates --out's directory
    print('wrote %s' % path)
    return 0


def cmd_check_kernels(args):
    """mxmp check-kernels: :func:`mxmp._src.conformance.check.cmd` (the kernel conformance run)."""
    from .. import conformance
    return conformance.cmd(args)
