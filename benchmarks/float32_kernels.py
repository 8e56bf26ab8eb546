"""The benchmark's "float32 with mxmp's kernels" baseline: a float32 network whose graph went
through the pass's float32 rewrites, and nothing else.

mxmp's bfloat16 graph gains in two ways: matrix products in bfloat16, and float32 rewrites that
would speed float32 up as much (the kernel rule's library ops for LayerNorm, softmax with lengths
and Dropout, :mod:`mxmp._src.graph.kernel_rule`; the reduction rule's ``sum``/``mean`` as a
matrix-vector product, :mod:`mxmp._src.graph.reduce_rule`). The ratio against this baseline is
what bfloat16 itself buys; the ratio against plain float32 what a user switching to mxmp gets
(docs/benchmark.md). Every tensor stays float32: no cast, no loss scale, float32 weights; the
library ops compute the same function as MXNet's (Dropout with another random mask).
"""

__all__ = ['float32_library_kernels']


def float32_library_kernels(net, data_names, kernels='auto'):
    """``net`` as a float32 SymbolBlock running mxmp's float32 rewrites.

    Args:
        net (mxnet.gluon.HybridBlock): the float32 network, initialized; its parameters are
            shared (the returned block trains them).
        data_names (sequence of str): the names of ``net``'s inputs in call order.
        kernels (str): ``'auto'`` (the kernel rule's default set, as ``Policy(kernels='auto')``)
            or ``'all'`` (also its opt-in ops).

    Returns:
        mxnet.gluon.SymbolBlock: the traced graph of ``net`` with the kernel rule and the
        reduction rule applied (float32 inputs, float32 everywhere); call it with the same
        inputs as ``net``.

    Raises:
        RuntimeError: mxmp's operator library does not build or load here, or the kernel rule
            replaced none of the nodes it would (``MXNET_EXEC_ENABLE_ADDTO`` set): the baseline
            would be plain float32 under another name.
    """
    import mxnet as mx
    from mxnet import gluon
    from mxmp import Policy
    from mxmp._src.graph.kernel_rule import _chosen, apply_kernels
    from mxmp._src.graph.reduce_rule import substitute as substitute_reductions
    from mxmp._src.graph.symbol_json import dump, load
    from mxmp._src.kernels.build import load_library
    if load_library() is None:
        raise RuntimeError("mxmp's operator library does not load here: the float32 baseline "
                           "with mxmp's kernels needs it (`mxmp check-kernels` says why)")
    inputs = [mx.sym.var(name) for name in data_names]
    out = net(*inputs)
    sym = mx.sym.Group(list(out)) if isinstance(out, (list, tuple)) else out
    original = load(sym)
    graph = apply_kernels(original, kernels)
    if graph is original and _chosen(original, kernels):
        # the rule had nodes to replace and left them (MXNET_EXEC_ENABLE_ADDTO, which it warns
        # about): the row would be plain float32 under another name
        raise RuntimeError("mxmp's kernel rule left the float32 graph unchanged (is "
                           "MXNET_EXEC_ENABLE_ADDTO set? unset it for mxmp's kernels)")
    # The reduction rule rewrites float32 reductions and keeps them float32 (it reads the
    # policy only for its switch and the user's op lists: the defaults here).
    graph = substitute_reductions(graph, Policy('bfloat16'),
                                  {name: 'float32' for name in data_names})
    return gluon.SymbolBlock(dump(graph), inputs, params=net.collect_params())
