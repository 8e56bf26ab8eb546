"""Property-based tests of the graph pass (:mod:`mxmp._src.graph`) on random float32 DAGs.

A hypothesis strategy (:func:`graphs`) builds random ``mx.sym`` graphs from a broad op set
(Convolution, FullyConnected, BatchNorm with and without ``output_mean_var``, Activation,
LeakyReLU, Pooling, elementwise/broadcast binary ops, Concat, add_n, Reshape/Flatten,
slice/slice_axis, transpose, softmax/log_softmax, SoftmaxOutput, dot/batch_dot, Dropout,
Embedding with int32 or float32 indices, LayerNorm, SliceChannel, scalar ops, exp/log/sqrt/
square, sum/mean). Shapes are tracked while the graph grows, so every graph is valid by
construction; a bound on every tensor's magnitude (and a lower bound for positive tensors) is
tracked too, so exp only sees small inputs, log and sqrt only inputs bounded away from zero, and
no value comes near float16's overflow.

Every graph is converted to float16 and bfloat16, with and without ``cast_params``, with the
data input in float32 or in the target dtype (``data_dtypes``), and these properties are checked:

* the real graph type-checks in MXNet (``infer_type`` on every internal output, untyped inputs
  float32); every low-precision-class op gets target-dtype data inputs; no low-precision tensor
  reaches a float32-class or loss op; widest-type and follow ops get one dtype, the widest of
  their sources (they never cast down); outputs are float32;
* no tensor is cast twice to one dtype, and (real graph) no tensor is cast to its own dtype;
* the emulated graph (``emulate=True``) runs on CPU with float32 kernels only, rounds through
  the target dtype exactly the tensors that are low precision in the real graph, its outputs
  that are low precision in the real graph hold only target-dtype values, and it matches the
  float32 graph within ``2 * eps(target) * (depth + 1)`` relative to the error scale of the
  tensors the output depends on (:func:`error_scales`);
* converting a converted graph changes nothing; ``remove_casts`` gives back the float32 graph;
  converting the same graph built twice from scratch gives identical JSON;
* random ``Policy`` overrides (lp_ops, fp32_ops, excluded_names) are obeyed, and ``explain``
  reports the dtype each node has in the converted graph.

Example budget: ``MXMP_FUZZ_EXAMPLES`` sets ``max_examples`` of every property (default 200
graphs each, about 1.5 minutes for the file on a 2-core CPU); e.g.
``MXMP_FUZZ_EXAMPLES=2000 python -m pytest tests/graph/test_pass_properties.py`` for a long hunt.
Examples are derandomized (fixed seed), so CI checks the same graphs every run; a failing
graph is printed as the ``mx.sym`` calls that build it.

Graphs run with MXNet's MKLDNN subgraph backend off (see :func:`forward`): in MXNet 1.9.1 it
computes wrong float32 results for some graphs, which would make the reference wrong.
"""
import collections
import json
import math
import os

import mxnet as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mxnet import nd

import mxmp
from mxmp._src.graph.kernel_rule import FLOAT32_INPUTS as KERNEL_FLOAT32_INPUTS, INPUT_COPY, \
    TIE, original_op
from mxmp._src.graph.rule_notes import RESIDUAL_MARK, library_class, rewritten_class
from mxmp._src.graph.symbol_json import MARK, ROUND_MARK
from mxmp._src.policy.policy import FLOAT32, FOLLOW, LOSS_OUTPUT, LOW_PRECISION, WIDEST_TYPE

EXAMPLES = int(os.environ.get('MXMP_FUZZ_EXAMPLES', '200'))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

TARGETS = ('bfloat16', 'float16')
LOW = ('bfloat16', 'float16')
RANK = {'float16': 1, 'bfloat16': 1, 'float32': 2, 'float64': 3}
MSHADOW = {'float32': '0', 'float16': '2', 'int32': '4', 'bfloat16': '12'}  # mshadow/base.h
#: Unit roundoff of the target dtypes (8 and 11 significant bits).
EPS = {'bfloat16': 2.0 ** -8, 'float16': 2.0 ** -11}
#: Error allowed per level of depth, in units of eps * scale: two roundings per op (its input
#: cast, its output). On 2000 random graphs (31,616 outputs, seeds not derandomized) the worst
#: output used 0.48 eps * scale * (depth + 1), a quarter of this.
TOL_FACTOR = 2.0
MAX_MAGNITUDE = 1e3   # no tensor may exceed this bound (float16 overflows at 65504)
N = 2                 # batch size of every data input


def _bf16():
    from mxnet.contrib.amp.amp import bfloat16
    return bfloat16


def dtype_name(t):
    if t is None:
        return None
    d = np.dtype(t)
    return 'bfloat16' if d.names == ('bfloat16',) else d.name


# =============================================================================================
# Random graphs
# =============================================================================================
_Step = collections.namedtuple('_Step', 'out op inputs kwargs n_out')
_Tensor = collections.namedtuple('_Tensor', 'ref shape hi lo depth index')
# ref: (step number, output) ; hi: bound on |x| ; lo: lower bound if every element is > 0
# (else None) ; depth: longest chain of ops from an input ; index: None for data tensors,
# else the exclusive upper bound of the integer values it holds (usable as Embedding indices)


class FuzzGraph:
    """A random graph as a list of steps, rebuilt into a fresh ``mx.sym`` by :meth:`build`."""

    def __init__(self, steps, heads, var_init, depth):
        self.steps, self.heads, self.var_init, self.depth = steps, heads, var_init, depth

    def build(self):
        made = []

        def entry(i, k):
            return made[i][k] if self.steps[i].n_out > 1 else made[i]

        for s in self.steps:
            if s.op == 'var':
                sym = mx.sym.var(s.out, **s.kwargs)
            else:
                fn = getattr(mx.sym, s.op, None) or getattr(mx.sym._internal, s.op)
                sym = fn(*[entry(i, k) for i, k in s.inputs], name=s.out, **s.kwargs)
            made.append(sym)
        outs = [entry(i, k) for i, k in self.heads]
        return outs[0] if len(outs) == 1 else mx.sym.Group(outs)

    def __repr__(self):
        def ref(entry):
            i, k = entry
            return self.steps[i].out + ('[%d]' % k if self.steps[i].n_out > 1 else '')
        lines = []
        for s in self.steps:
            if s.op == 'var':
                args = [repr(s.out)] + ['%s=%r' % kv for kv in sorted(s.kwargs.items())]
                lines.append('%s = mx.sym.var(%s)' % (s.out, ', '.join(args)))
            else:
                args = [ref(e) for e in s.inputs] + ['%s=%r' % kv for kv in
                                                     sorted(s.kwargs.items())]
                module = 'mx.sym._internal' if s.op.startswith('_') else 'mx.sym'
                lines.append('%s = %s.%s(%s, name=%r)' % (s.out, module, s.op, ', '.join(args),
                                                          s.out))
        if len(self.heads) == 1:
            lines.append('sym = %s' % ref(self.heads[0]))
        else:
            lines.append('sym = mx.sym.Group([%s])' % ', '.join(ref(h) for h in self.heads))
        return '\n' + '\n'.join(lines) + '\n'


class _Builder:
    """Grows a graph while tracking shapes and bounds; every ``op_*`` method adds one op."""

    def __init__(self, draw):
        self.draw = draw
        self.steps, self.tensors, self.var_init = [], [], {}

    # -- bookkeeping ----------------------------------------------------------------------
    def name(self, op):
        return 'n%d_%s' % (len(self.steps), op.lstrip('_'))

    def var(self, name, shape, init, hi, lo=None, index=None, **kwargs):
        self.steps.append(_Step(name, 'var', [], kwargs, 1))
        self.var_init[name] = (shape, init)
        t = _Tensor((len(self.steps) - 1, 0), shape, hi, lo, 0, index)
        self.tensors.append(t)
        return t

    def add(self, op, inputs, kwargs, outs):
        """outs: list of (shape, hi, lo) or (shape, hi, lo, index) per output."""
        name = self.name(op)
        depth = 1 + max([t.depth for t in inputs] or [0])
        self.steps.append(_Step(name, op, [t.ref for t in inputs], kwargs, len(outs)))
        made = []
        for k, o in enumerate(outs):
            shape, hi, lo = o[:3]
            t = _Tensor((len(self.steps) - 1, k), tuple(shape), hi, lo, depth,
                        o[3] if len(o) > 3 else None)
            self.tensors.append(t)
            made.append(t)
        return made

    def floats(self, pred=lambda t: True):
        """Data tensors (float index tensors included) satisfying pred, most recent first."""
        return [t for t in reversed(self.tensors)
                if (t.index is None or self.is_float_index(t)) and pred(t)]

    def is_float_index(self, t):
        return t.index is not None and self._root_dtype(t) == 'float32'

    def _root_dtype(self, t):
        step = self.steps[t.ref[0]]
        while step.op != 'var':
            step = self.steps[step.inputs[0][0]]
        return step.kwargs.get('dtype', 'float32')

    def pick(self, candidates):
        """One of ``candidates`` (most recent first): half the time the most recent, so
        chains grow deep."""
        if len(candidates) == 1 or self.draw(st.booleans()):
            return candidates[0]
        return candidates[self.draw(st.integers(1, len(candidates) - 1))]

    def choice(self, values):
        return self.draw(st.sampled_from(values))

    # -- ops --------------------------------------------------------------------------------
    # Each returns None when it does not apply to the current pool.
    def op_Convolution(self):
        c = self.floats(lambda t: len(t.shape) == 4)
        if not c:
            return None
        x = self.pick(c)
        k = self.choice([1, 3])
        f = self.draw(st.integers(1, 4))
        kw = dict(kernel=(k, k), num_filter=f, pad=(k // 2, k // 2),
                  no_bias=self.draw(st.booleans()))
        # weights uniform(-1, 1) / fan_in: |y| <= |x| + |bias|
        self.add('Convolution', [x], kw, [((x.shape[0], f) + x.shape[2:], x.hi + 0.5, None)])
        return True

    def op_FullyConnected(self):
        c = self.floats(lambda t: len(t.shape) >= 2)
        if not c:
            return None
        x = self.pick(c)
        h = self.draw(st.integers(1, 6))
        flatten = len(x.shape) == 2 or self.draw(st.booleans())
        shape = (x.shape[0], h) if flatten else x.shape[:-1] + (h,)
        kw = dict(num_hidden=h, no_bias=self.draw(st.booleans()))
        if not flatten:
            kw['flatten'] = False
        self.add('FullyConnected', [x], kw, [(shape, x.hi + 0.5, None)])
        return True

    def op_BatchNorm(self):
        c = self.floats(lambda t: len(t.shape) >= 2)
        if not c:
            return None
        x = self.pick(c)
        mv = self.draw(st.booleans())
        kw = dict(fix_gamma=self.draw(st.booleans()))
        # inference: gamma in [0.5, 1.5], beta and moving mean in [-0.5, 0.5], moving var in
        # [0.5, 1.5]: |y| <= 1.5 (|x| + 0.5) / sqrt(0.5) + 0.5
        outs = [(x.shape, 2.2 * (x.hi + 0.5) + 0.5, None)]
        if mv:
            kw['output_mean_var'] = True
            # inference outputs: the moving mean and 1/sqrt(moving var + eps)
            outs += [((x.shape[1],), 0.5, None), ((x.shape[1],), 1.5, 0.8)]
        self.add('BatchNorm', [x], kw, outs)
        return True

    def op_Activation(self):
        x = self.pick(self.floats())
        act = self.choice(['relu', 'sigmoid', 'tanh', 'softrelu', 'softsign'])
        hi, lo = {'relu': (x.hi, x.lo), 'sigmoid': (1.0, math.exp(-x.hi)), 'tanh': (1.0, None),
                  'softrelu': (x.hi + 0.7, math.log1p(math.exp(-x.hi))),
                  'softsign': (1.0, None)}[act]
        self.add('Activation', [x], dict(act_type=act), [(x.shape, hi, lo)])
        return True

    def op_LeakyReLU(self):
        c = self.floats(lambda t: len(t.shape) >= 2)
        if not c:
            return None
        x = self.pick(c)
        act = self.choice(['leaky', 'elu', 'prelu', 'gelu', 'selu'])
        kw = dict(act_type=act)
        if act == 'leaky':
            kw['slope'] = self.choice([0.1, 0.25])
        hi = {'selu': 1.06 * max(x.hi, 1.76), 'elu': max(x.hi, 1.0)}.get(act, x.hi)
        self.add('LeakyReLU', [x], kw, [(x.shape, hi, None)])
        return True

    def op_Pooling(self):
        c = self.floats(lambda t: len(t.shape) == 4)
        if not c:
            return None
        x = self.pick(c)
        kind = self.choice(['max', 'avg'])
        n, ch, h, w = x.shape
        if self.draw(st.booleans()) or h < 2 or w < 2:
            kw, shape = dict(kernel=(1, 1), global_pool=True, pool_type=kind), (n, ch, 1, 1)
        else:
            kw, shape = dict(kernel=(2, 2), stride=(2, 2), pool_type=kind), \
                (n, ch, (h - 2) // 2 + 1, (w - 2) // 2 + 1)
        self.add('Pooling', [x], kw, [(shape, x.hi, x.lo)])
        return True

    def _binary_bound(self, op, a, b):
        if op.endswith('mul'):
            return a.hi * b.hi, (a.lo * b.lo if a.lo and b.lo else None)
        if op.endswith('add'):
            return a.hi + b.hi, (a.lo + b.lo if a.lo and b.lo else None)
        return a.hi + b.hi, None

    def op_elemwise(self):
        op = self.choice(['elemwise_add', 'elemwise_mul', 'elemwise_sub'])
        a = self.pick(self.floats())
        b = self.pick(self.floats(lambda t: t.shape == a.shape))  # may be a itself
        hi, lo = self._binary_bound(op, a, b)
        self.add(op, [a, b], {}, [(a.shape, hi, lo)])
        return True

    def op_broadcast(self):
        op = self.choice(['broadcast_add', 'broadcast_mul'])
        a = self.pick(self.floats())
        b = self.pick(self.floats(lambda t: len(t.shape) == len(a.shape) and all(
            p == q or p == 1 or q == 1 for p, q in zip(t.shape, a.shape))))
        hi, lo = self._binary_bound(op, a, b)
        self.add(op, [a, b], {}, [(tuple(max(p, q) for p, q in zip(a.shape, b.shape)), hi, lo)])
        return True

    def op_Concat(self):
        c = self.floats(lambda t: len(t.shape) >= 2)
        if not c:
            return None
        a = self.pick(c)
        same = self.floats(lambda t: len(t.shape) == len(a.shape) and
                           t.shape[:1] + t.shape[2:] == a.shape[:1] + a.shape[2:])
        parts = [a] + [self.pick(same) for _ in range(self.draw(st.integers(1, 2)))]
        shape = (a.shape[0], sum(t.shape[1] for t in parts)) + a.shape[2:]
        los = [t.lo for t in parts]
        self.add('Concat', parts, dict(dim=1), [(shape, max(t.hi for t in parts),
                                                 min(los) if all(los) else None)])
        return True

    def op_add_n(self):
        a = self.pick(self.floats())
        parts = [a] + [self.pick(self.floats(lambda t: t.shape == a.shape))
                       for _ in range(self.draw(st.integers(1, 2)))]
        los = [t.lo for t in parts]
        self.add('add_n', parts, {}, [(a.shape, sum(t.hi for t in parts),
                                       sum(los) if all(los) else None)])
        return True

    def _reshape_target(self, shape):
        """A new shape for a tensor of this shape (first axis kept), or None."""
        if len(shape) > 2:
            return (shape[0], int(np.prod(shape[1:])))
        c = shape[1] if len(shape) == 2 else None
        if c is None:
            return None
        factors = [(a, c // a) for a in range(1, c + 1) if c % a == 0]
        options = [(shape[0], c, 1, 1)] + [(shape[0],) + f for f in factors]
        return self.choice(options)

    def op_Reshape(self, index=False):
        pool = ([t for t in reversed(self.tensors) if t.index is not None] if index
                else self.floats())
        c = [t for t in pool if len(t.shape) >= 2]
        if not c:
            return None
        x = self.pick(c)
        target = self._reshape_target(x.shape)
        if len(x.shape) > 2 and self.draw(st.booleans()):
            op, kw = 'Flatten', {}
        else:
            op, kw = 'Reshape', dict(shape=(0, -1) if len(target) == 2 else target)
        self.add(op, [x], kw, [(target, x.hi, x.lo, x.index)])
        return True

    def op_slice_axis(self, index=False):
        pool = ([t for t in reversed(self.tensors) if t.index is not None] if index
                else self.floats())
        c = [t for t in pool if any(d >= 2 for d in t.shape[1:])]
        if not c:
            return None
        x = self.pick(c)
        axis = self.choice([a for a in range(1, len(x.shape)) if x.shape[a] >= 2])
        begin = self.draw(st.integers(0, x.shape[axis] - 1))
        end = self.draw(st.integers(begin + 1, x.shape[axis]))
        shape = list(x.shape)
        shape[axis] = end - begin
        if self.draw(st.booleans()):
            op, kw = 'slice_axis', dict(axis=axis, begin=begin, end=end)
        else:
            op = 'slice'
            kw = dict(begin=(None,) * axis + (begin,), end=(None,) * axis + (end,))
        self.add(op, [x], kw, [(shape, x.hi, x.lo, x.index)])
        return True

    def op_transpose(self, index=False):
        pool = ([t for t in reversed(self.tensors) if t.index is not None] if index
                else self.floats())
        c = [t for t in pool if len(t.shape) >= 2]
        if not c:
            return None
        x = self.pick(c)
        axes = tuple(self.draw(st.permutations(range(len(x.shape)))))
        kw = {} if axes == tuple(reversed(range(len(x.shape)))) else dict(axes=axes)
        self.add('transpose', [x], kw, [(tuple(x.shape[a] for a in axes), x.hi, x.lo,
                                         x.index)])
        return True

    def op_softmax(self):
        x = self.pick(self.floats())
        n = x.shape[-1]
        if self.draw(st.booleans()):
            self.add('softmax', [x], {}, [(x.shape, 1.0, math.exp(-2 * x.hi) / n)])
        else:
            self.add('log_softmax', [x], {}, [(x.shape, 2 * x.hi + math.log(n), None)])
        return True

    def op_SoftmaxOutput(self):
        c = self.floats(lambda t: len(t.shape) == 2)
        if not c:
            return None
        x = self.pick(c)
        label = self.var(self.name('label'), (x.shape[0],), 'zeros', 0.0)
        # forward: the softmax of x (the label only matters for the gradient)
        self.add('SoftmaxOutput', [x, label], {}, [(x.shape, 1.0,
                                                    math.exp(-2 * x.hi) / x.shape[1])])
        return True

    def op_batch_dot(self):
        if not self.floats(lambda t: len(t.shape) == 3):
            c = self.floats(lambda t: len(t.shape) == 2)
            if not c:
                return None
            x = self.pick(c)  # make a 3-d tensor: (N, C) -> (N, C, 1) or (N, 1, C)
            shape = self.choice([x.shape + (1,), x.shape[:1] + (1,) + x.shape[1:]])
            self.add('Reshape', [x], dict(shape=shape), [(shape, x.hi, x.lo, x.index)])
        return self.op_dot(ndim=3)

    def op_dot(self, ndim=2):
        c = self.floats(lambda t: len(t.shape) == ndim)
        if not c:
            return None
        a = self.pick(c)
        k = a.shape[-1]
        if len(a.shape) == 2:
            op = 'dot'
            mates = self.floats(lambda t: len(t.shape) == 2 and k in t.shape)
            if self.draw(st.booleans()):
                d = self.draw(st.integers(1, 4))
                # a weight matrix of the graph: uniform(-1, 1) / k, |y| <= |a|
                b = self.var(self.name('rhs'), (k, d), 'fan_in', 1.0 / k)
                kw, shape, hi = {}, (a.shape[0], d), a.hi
            else:
                b = self.pick(mates)
                transpose_b = b.shape[-1] == k and (b.shape[0] != k or self.draw(st.booleans()))
                kw = dict(transpose_b=True) if transpose_b else {}
                shape = (a.shape[0], b.shape[0] if transpose_b else b.shape[1])
                hi = k * a.hi * b.hi
        else:
            op = 'batch_dot'
            mates = self.floats(lambda t: len(t.shape) == 3 and t.shape[0] == a.shape[0] and
                                k in t.shape[1:])
            b = self.pick(mates)
            transpose_b = b.shape[-1] == k and (b.shape[1] != k or self.draw(st.booleans()))
            kw = dict(transpose_b=True) if transpose_b else {}
            shape = a.shape[:2] + ((b.shape[1],) if transpose_b else (b.shape[2],))
            hi = k * a.hi * b.hi
        self.add(op, [a, b], kw, [(shape, hi, None)])
        return True

    def op_Dropout(self):
        x = self.pick(self.floats())
        self.add('Dropout', [x], dict(p=0.5), [(x.shape, x.hi, x.lo)])  # identity at inference
        return True

    def index_var(self):
        for t in self.tensors:
            if t.index is not None:
                return None
        if self.draw(st.booleans()):
            # integer indices, typed in the graph
            return self.var('idx', (N, self.draw(st.integers(1, 3))), 'index', 3.0, index=4,
                            dtype='int32')
        # integer values held in float32 (MXNet's default for Embedding data): also a data tensor
        return self.var('idx', (N, self.draw(st.integers(1, 3))), 'index', 3.0, index=4)

    def op_Embedding(self):
        self.index_var()
        idx = self.pick([t for t in reversed(self.tensors) if t.index is not None])
        dim, out = self.draw(st.integers(idx.index, 7)), self.draw(st.integers(1, 4))
        # weight uniform(-1, 1)
        self.add('Embedding', [idx], dict(input_dim=dim, output_dim=out),
                 [(idx.shape + (out,), 1.0, None)])
        return True

    def op_index(self):
        """A structural op (reshape, slice, transpose) on an index tensor."""
        self.index_var()
        op = self.choice([self.op_Reshape, self.op_slice_axis, self.op_transpose])
        return op(index=True)

    def op_LayerNorm(self):
        c = self.floats(lambda t: len(t.shape) >= 2 and t.shape[-1] >= 2)
        if not c:
            return None
        x = self.pick(c)
        n = x.shape[-1]
        # gamma in [0.5, 1.5], beta in [-0.5, 0.5]: |y| <= 1.5 sqrt(n - 1) + 0.5
        self.add('LayerNorm', [x], {}, [(x.shape, 1.5 * math.sqrt(n) + 0.5, None)])
        return True

    def op_SliceChannel(self):
        c = [(t, a, k) for t in self.floats() for a in range(1, len(t.shape))
             for k in (2, 3) if t.shape[a] % k == 0]
        if not c:
            return None
        x, axis, k = self.pick(c)
        shape = list(x.shape)
        shape[axis] //= k
        self.add('SliceChannel', [x], dict(num_outputs=k, axis=axis),
                 [(shape, x.hi, x.lo)] * k)
        return True

    def op_scalar(self):
        x = self.pick(self.floats())
        s = self.choice([0.5, 2.0, -1.5, 3.0])
        if self.draw(st.booleans()):
            lo = (x.lo + s) if (x.lo is not None and s > 0) else None
            self.add('_plus_scalar', [x], dict(scalar=s), [(x.shape, x.hi + abs(s), lo)])
        else:
            lo = x.lo * s if (x.lo is not None and s > 0) else None
            self.add('_mul_scalar', [x], dict(scalar=s), [(x.shape, x.hi * abs(s), lo)])
        return True

    def op_square(self):
        x = self.pick(self.floats())
        # square then + s (s >= 0.5) is a positive tensor for log and sqrt
        self.add('square', [x], {}, [(x.shape, x.hi ** 2, None)])
        return True

    def op_exp(self):
        c = self.floats(lambda t: t.hi <= 4)
        if not c:
            return None
        x = self.pick(c)
        self.add('exp', [x], {}, [(x.shape, math.exp(x.hi), math.exp(-x.hi))])
        return True

    def op_log_sqrt(self):
        # only on tensors bounded away from zero, so that their relative rounding error stays
        # a small absolute error of the log, and sqrt stays well-conditioned
        c = self.floats(lambda t: t.lo is not None and t.lo >= 1e-4)
        if not c:  # make one: x * x + 1
            x = self.pick(self.floats())
            x, = self.add('square', [x], {}, [(x.shape, x.hi ** 2, None)])
            c, = self.add('_plus_scalar', [x], dict(scalar=1.0), [(x.shape, x.hi + 1, 1.0)])
            c = [c]
        x = self.pick(c)
        if self.choice(['log', 'sqrt']) == 'log':
            hi = max(abs(math.log(x.lo)), abs(math.log(max(x.hi, 1.0))))
            self.add('log', [x], {}, [(x.shape, hi, None)])
        else:
            self.add('sqrt', [x], {}, [(x.shape, math.sqrt(x.hi), math.sqrt(x.lo))])
        return True

    def op_reduce(self):
        x = self.pick(self.floats())
        op = self.choice(['sum', 'mean'])
        if len(x.shape) > 1 and self.draw(st.booleans()):
            axis = self.draw(st.integers(1, len(x.shape) - 1))
            keep = self.draw(st.booleans())
            shape = list(x.shape)
            n = shape[axis]
            if keep:
                shape[axis] = 1
            else:
                del shape[axis]
            kw = dict(axis=axis, keepdims=True) if keep else dict(axis=axis)
        else:
            shape, kw, n = (1,), {}, int(np.prod(x.shape))
        scale = n if op == 'sum' else 1
        lo = x.lo * scale if x.lo is not None else None
        self.add(op, [x], kw, [(tuple(shape), x.hi * scale, lo)])
        return True


OPS = ['op_Convolution', 'op_FullyConnected', 'op_BatchNorm', 'op_Activation', 'op_LeakyReLU',
       'op_Pooling', 'op_elemwise', 'op_broadcast', 'op_Concat', 'op_add_n', 'op_Reshape',
       'op_slice_axis', 'op_transpose', 'op_softmax', 'op_SoftmaxOutput', 'op_dot', 'op_batch_dot',
       'op_Dropout', 'op_Embedding', 'op_index', 'op_LayerNorm', 'op_SliceChannel', 'op_scalar',
       'op_square', 'op_exp', 'op_log_sqrt', 'op_reduce']


@st.composite
def graphs(draw, max_ops=12):
    """A random float32 DAG (:class:`FuzzGraph`) of 1 to ``max_ops`` ops on input ``data``."""
    b = _Builder(draw)
    if draw(st.booleans()):
        shape = (N, draw(st.integers(1, 4)), draw(st.integers(1, 5)), draw(st.integers(1, 5)))
    else:
        shape = (N, draw(st.integers(1, 6)))
    b.var('data', shape, 'uniform', 1.0)
    for _ in range(draw(st.integers(1, max_ops))):
        before = len(b.steps)
        for _ in range(4):  # a few tries to find an op that applies to the current tensors
            if getattr(b, draw(st.sampled_from(OPS)))() is not None:
                break
        else:
            b.op_Activation()
        new = b.tensors[-1]
        too_big = new.hi > MAX_MAGNITUDE or int(np.prod(new.shape)) > 512
        if too_big:  # undo: keep the graph small and its values well inside float16's range
            del b.steps[before:]
            b.tensors = [t for t in b.tensors if t.ref[0] < before]
            for name in [n for n in b.var_init if n not in {s.out for s in b.steps}]:
                del b.var_init[name]
            x = b.floats()[0]
            b.add('Activation', [x], dict(act_type='tanh'), [(x.shape, 1.0, None)])
    used = {e for s in b.steps for e in s.inputs}
    # Outputs: every float tensor computed and not consumed (so no op is dead code) ...
    heads = [t for t in b.floats() if b.steps[t.ref[0]].op != 'var' and t.ref not in used]
    if not heads:
        b.op_Activation()
        heads = [b.tensors[-1]]
    # ... and sometimes one more: a consumed tensor, an input, or an output twice.
    if draw(st.booleans()):
        candidates = b.floats()
        heads.append(candidates[draw(st.integers(0, len(candidates) - 1))])
    return FuzzGraph(b.steps, [t.ref for t in heads], dict(b.var_init),
                     [t.depth for t in heads])


# =============================================================================================
# Inputs and runs
# =============================================================================================
def make_args(fg, sym, seed=0):
    """Arrays for every argument and auxiliary state of the float32 graph ``sym``."""
    rng = np.random.RandomState(seed)
    shapes = {n: s for n, (s, _) in fg.var_init.items()}
    arg_shapes, _, aux_shapes = sym.infer_shape(**{n: s for n, s in shapes.items()
                                                   if n in sym.list_arguments()})
    js, dtypes = entry_dtypes(sym)
    arg_type = {n['name']: dtypes[(i, 0)] for i, n in enumerate(js['nodes']) if n['op'] == 'null'}
    owner = {}  # parameter name -> op of the node that consumes it
    for node in js['nodes']:
        for src, _, _ in node['inputs']:
            if js['nodes'][src]['op'] == 'null':
                owner.setdefault(js['nodes'][src]['name'], (node['op'], node['name']))

    def init(name, shape):
        if name in fg.var_init:
            kind = fg.var_init[name][1]
            if kind == 'uniform':
                return rng.uniform(-1, 1, shape)
            if kind == 'zeros':
                return np.zeros(shape)
            if kind == 'index':
                return rng.randint(0, 4, shape)
            return rng.uniform(-1, 1, shape) / shape[0]  # 'fan_in': rows are the inputs
        op, node = owner[name]
        role = name[len(node) + 1:]
        if op == 'BatchNorm':
            return {'gamma': rng.uniform(0.5, 1.5, shape), 'beta': rng.uniform(-0.5, 0.5, shape),
                    'moving_mean': rng.uniform(-0.5, 0.5, shape),
                    'moving_var': rng.uniform(0.5, 1.5, shape)}[role]
        if op == 'LayerNorm':
            return rng.uniform(0.5, 1.5, shape) if role == 'gamma' else \
                rng.uniform(-0.5, 0.5, shape)
        if op == 'Embedding':
            return rng.uniform(-1, 1, shape)
        if len(shape) >= 2:  # weights: uniform(-1, 1) / fan_in
            return rng.uniform(-1, 1, shape) / np.prod(shape[1:])
        return rng.uniform(-0.5, 0.5, shape)  # biases, prelu slopes

    args = {n: nd.array(init(n, s), dtype=arg_type[n])
            for n, s in zip(sym.list_arguments(), arg_shapes)}
    aux = {n: nd.array(init(n, s)) for n, s in zip(sym.list_auxiliary_states(), aux_shapes)}
    return args, aux


def to_dtype(arr, dtype):
    return nd.amp_cast(arr, dtype=_bf16() if dtype == 'bfloat16' else dtype)


def forward(sym, args, aux):
    """Run ``sym`` for inference, without MXNet's MKLDNN subgraph backend.

    The backend (on by default for ``bind`` on CPU) has bugs of its own that this fuzzing hit
    in float32 graphs, mxmp aside: it returns the sigmoid of a FullyConnected output that is
    also a graph output when an Activation consumes it (FC -> sigmoid fused, wrong numbers),
    and fails to bind Dropout(Dropout(x)) and some graphs whose internals are all outputs
    ("Check failed: arg_names.size() == in_args_map.size()").
    """
    saved = os.environ.get('MXNET_SUBGRAPH_BACKEND')
    os.environ['MXNET_SUBGRAPH_BACKEND'] = 'NONE'
    try:
        exe = sym.bind(mx.cpu(), args=args, aux_states={k: v.copy() for k, v in aux.items()},
                       grad_req='null')
    finally:
        if saved is None:
            del os.environ['MXNET_SUBGRAPH_BACKEND']
        else:
            os.environ['MXNET_SUBGRAPH_BACKEND'] = saved
    return exe.forward(is_train=False)


# =============================================================================================
# Checks on converted graphs (each returns a list of violations, empty when the graph is fine)
# =============================================================================================
def entry_dtypes(sym, given=None):
    """(node index, output) -> dtype name for every visible output in ``sym``'s JSON (casts
    kept), by MXNet's type inference; untyped inputs are float32 unless named in ``given``."""
    js = json.loads(sym.tojson(remove_amp_cast=False))
    given = given or {}
    typed = json.loads(json.dumps(js))
    for node in typed['nodes']:
        if node['op'] == 'null' and '__dtype__' not in node.get('attrs', {}):
            # through the attribute: Symbol.infer_type ignores bfloat16 keyword arguments
            node.setdefault('attrs', {})['__dtype__'] = MSHADOW[given.get(node['name'],
                                                                          'float32')]
    internals = mx.sym.load_json(json.dumps(typed)).get_internals()
    _, out_types, _ = internals.infer_type()
    nid_of = {n['name']: i for i, n in enumerate(js['nodes'])}
    assert len(nid_of) == len(js['nodes']), 'node names are not unique'
    result, previous, k = {}, None, 0
    for p, t in enumerate(out_types):
        owner = internals[p].name
        k = k + 1 if owner == previous else 0
        previous = owner
        result[(nid_of[owner], k)] = dtype_name(t)
    return js, result


def cast_violations(sym, given=None, real=True):
    """Casts repeated (same input entry and dtype) or, in a real graph, casts to the dtype the
    tensor already has."""
    js, dtypes = entry_dtypes(sym, given)
    nodes, seen, bad = js['nodes'], {}, []
    for nid, node in enumerate(nodes):
        if node['op'] != 'amp_cast':
            continue
        src, out, _ = node['inputs'][0]
        key = (src, out, node['attrs']['dtype'])
        if key in seen:
            bad.append('%s and %s both cast %s:%d to %s' % (seen[key], node['name'],
                                                          nodes[src]['name'], out, key[2]))
        seen[key] = node['name']
        if real and dtypes[(src, out)] == node['attrs']['dtype']:
            bad.append('%s casts %s:%d, already %s, to %s' % (
                node['name'], nodes[src]['name'], out, dtypes[(src, out)], key[2]))
    return bad


def _source(nodes, entry):
    """Follow cast nodes back from an input entry to the tensor they cast."""
    src, out = entry[0], entry[1]
    while nodes[src]['op'] == 'amp_cast':
        src, out = nodes[src]['inputs'][0][:2]
    return src, out


def type_violations(sym, policy, given=None):
    """Violations of the op classes in a real (not emulated) converted graph."""
    js, dtypes = entry_dtypes(sym, given)
    nodes, bad = js['nodes'], []
    lp = policy.target_dtype
    for nid, node in enumerate(nodes):
        if node['op'] == 'null' or node['op'] in ('amp_cast', 'amp_multicast'):
            continue
        op = node['op']
        op_class, _ = policy.classify(op, node.get('attrs', {}), node['name'])
        index = set(policy.index_inputs(op))
        f32 = set(policy.float32_inputs(op))
        ins = [dtypes[(e[0], e[1])] for e in node['inputs']]
        data = [p for p, d in enumerate(ins) if d in RANK and p not in index | f32]
        if original_op(node) is not None:   # a library op: its data input (0) decides
            op_class, _ = library_class(policy, node, original_op(node))
            f32 = set(KERNEL_FLOAT32_INPUTS.get(op, ()))
            data = [0] if ins[0] in RANK else []
        elif node.get('attrs', {}).get(MARK) in (TIE, INPUT_COPY, RESIDUAL_MARK):
            # the kernel rule's shape ties and input copies (follow in bfloat16), the residual
            # rule's identity (low precision): the class their rule gives them
            op_class, _ = rewritten_class(policy, node, {})
        where = '%s %s (%s)' % (op, node['name'], op_class)
        for p in f32:
            if p < len(ins) and ins[p] in LOW:
                bad.append('%s: input %d must stay float32, got %s' % (where, p, ins[p]))
        if op_class == LOW_PRECISION:
            for p in data:
                if ins[p] != lp:
                    bad.append('%s: input %d is %s, not %s' % (where, p, ins[p], lp))
        elif op_class in (FLOAT32, LOSS_OUTPUT):
            for p in data:
                if ins[p] in LOW:
                    bad.append('%s: low-precision input %d (%s)' % (where, p, ins[p]))
        elif op_class in (WIDEST_TYPE, FOLLOW) and data:
            if len({ins[p] for p in data}) > 1:
                bad.append('%s: inputs of mixed dtypes %s' % (where, [ins[p] for p in data]))
            sources = [dtypes[_source(nodes, node['inputs'][p])] for p in data]
            widest = max(sources, key=lambda d: RANK[d])
            if RANK[ins[data[0]]] != RANK[widest]:
                bad.append('%s: computes in %s but its widest source is %s' % (
                    where, ins[data[0]], widest))
        else:
            assert op_class in (LOW_PRECISION, FLOAT32, LOSS_OUTPUT, WIDEST_TYPE, FOLLOW)
    for h in js['heads']:
        d = dtypes[(h[0], h[1])]
        if d in RANK and d != 'float32':
            bad.append('output %s:%d is %s' % (nodes[h[0]]['name'], h[1], d))
    return bad


def emulation_violations(real, emulated, policy, given=None):
    """The emulated graph computes with float32 kernels only, and rounds through the target
    dtype exactly the tensors that are low precision in the real graph."""
    rjs, rtypes = entry_dtypes(real, given)
    ejs, etypes = entry_dtypes(emulated, given)
    rnodes, enodes, bad = rjs['nodes'], ejs['nodes'], []
    rby = {n['name']: n for n in rnodes}
    lp = policy.target_dtype

    def rounding(node):
        """A node of the emulation: an amp_cast, or one of mxmp's elementwise bfloat16
        rounding nodes (``ROUND_MARK``); its first input leads back to the rounded tensor."""
        return node['op'] == 'amp_cast' or ROUND_MARK in node.get('attrs', {})

    def rounds_to(node):
        return node['attrs'].get(ROUND_MARK, node['attrs'].get('dtype'))

    first = {}
    for node in enodes:
        if rounding(node) and rounds_to(node) not in ('float32', lp):
            bad.append('%s rounds through %s, not the target dtype %s'
                       % (node['name'], rounds_to(node), lp))
        # an elementwise rounding chain starts once per tensor (amp_casts: cast_violations)
        src = node['inputs'][0] if node['inputs'] else None
        if ROUND_MARK in node.get('attrs', {}) and ROUND_MARK not in enodes[src[0]].get(
                'attrs', {}):
            key = (src[0], src[1], rounds_to(node))
            if key in first:
                bad.append('%s and %s both round %s:%d' % (first[key], node['name'],
                                                         enodes[src[0]]['name'], src[1]))
            first[key] = node['name']

    def real_chain(entry):
        """(source name, out), whether any tensor on the chain is low precision."""
        low = rtypes[(entry[0], entry[1])] in LOW
        src, out = entry[0], entry[1]
        while rnodes[src]['op'] == 'amp_cast':
            src, out = rnodes[src]['inputs'][0][:2]
            low = low or rtypes[(src, out)] in LOW
        return (rnodes[src]['name'], out), low

    def emulated_chain(entry):
        low = False
        src, out = entry[0], entry[1]
        while rounding(enodes[src]):
            low = low or rounds_to(enodes[src]) == lp
            src, out = enodes[src]['inputs'][0][:2]
        # a low-precision input (cast_params, data_dtypes) is rounded already
        return (enodes[src]['name'], out), low or etypes[(src, out)] in LOW

    for nid, node in enumerate(enodes):
        if node['op'] == 'null' or rounding(node):
            continue
        for p, e in enumerate(node['inputs']):
            if etypes[(e[0], e[1])] in LOW:
                bad.append('%s %s gets a %s input %d' % (node['op'], node['name'],
                                                         etypes[(e[0], e[1])], p))
        rnode = rby[node['name']]
        for p, (re, ee) in enumerate(zip(rnode['inputs'], node['inputs'])):
            want, got = real_chain(re), emulated_chain(ee)
            if want != got:
                bad.append('%s %s input %d: real graph %s, emulated %s (source, rounded)'
                           % (node['op'], node['name'], p, want, got))
    for rh, eh in zip(rjs['heads'], ejs['heads']):
        if etypes[(eh[0], eh[1])] != 'float32' and etypes[(eh[0], eh[1])] in RANK:
            bad.append('emulated output %s is %s' % (enodes[eh[0]]['name'],
                                                     etypes[(eh[0], eh[1])]))
        if real_chain(rh) != emulated_chain(eh):
            bad.append('output %s: real graph %s, emulated %s' % (
                rnodes[rh[0]]['name'], real_chain(rh), emulated_chain(eh)))
    return bad


def error_scales(sym, args, aux):
    """Per graph output: the scale of the rounding error it can carry (float32 run).

    An op's absolute error is at most about eps times the largest magnitude among the tensors
    it depends on, so a node's scale is the largest |value| of it and its inputs' scales, with
    one exception: LayerNorm divides its input's error by the row's standard deviation, so its
    scale is its input's scale * max|gamma| (1.5) / the smallest row std of its input.
    """
    js = json.loads(sym.tojson())
    internals = sym.get_internals()
    values = collections.defaultdict(list)
    for p, v in enumerate(forward(internals, args, aux)):
        values[internals[p].name].append(v.asnumpy())
    scale = []
    for node in js['nodes']:
        outs = [v for v in values[node['name']] if v.dtype == np.float32]
        s = max([float(np.abs(v).max()) for v in outs if v.size] + [0.0])
        ins = [scale[src] for src, _, _ in node['inputs']]
        s = max([s] + ins)
        if node['op'] == 'LayerNorm':
            x = values[js['nodes'][node['inputs'][0][0]]['name']][node['inputs'][0][1]]
            std = np.sqrt(x.astype(np.float64).var(axis=-1) + 1e-5)
            s = max(s, 1.5 * ins[0] / float(std.min()))
        scale.append(s)
    return [scale[h[0]] for h in js['heads']]


def representable(x, dtype):
    """Is every float32 value of ``x`` a value of ``dtype`` (float16 or bfloat16)?"""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if dtype == 'bfloat16':  # bfloat16 is the top 16 bits of a float32
        return bool(np.all(x.view(np.uint32) & 0xFFFF == 0))
    with np.errstate(over='ignore'):
        return bool(np.array_equal(x.astype(np.float16).astype(np.float32), x))


def mismatch(got, ref, scale, eps, depth):
    """None when ``got`` is within ``TOL_FACTOR * eps * (depth + 1)`` of ``ref``, relative to
    ``ref`` plus ``scale`` (:func:`error_scales`); else the
    ratio of the worst error to the tolerance."""
    tol = TOL_FACTOR * eps * (depth + 1)
    err = np.abs(got.astype(np.float64) - ref) / (tol * (np.abs(ref) + scale + 1e-30))
    worst = float(err.max()) if err.size else 0.0
    return None if worst <= 1 and np.all(np.isfinite(got)) else worst


# =============================================================================================
# The properties
# =============================================================================================
CONFIGS = [(t, cp) for t in TARGETS for cp in (False, True)]


def convert(sym, target, cast_params=False, emulate=False, data_lp=False):
    return mxmp.convert_symbol(sym, target, cast_params=cast_params, emulate=emulate,
                               data_dtypes={'data': target} if data_lp else None)


def given_dtypes(target, data_lp):
    return {'data': target} if data_lp else {}


@FUZZ
@given(fg=graphs(), data_lp=st.booleans())
def test_real_graph_gives_low_precision_ops_target_dtype_inputs_float32_ops_float32_inputs(
        fg, data_lp):
    sym = fg.build()
    for target, cast_params in CONFIGS:
        out = convert(sym, target, cast_params, data_lp=data_lp)
        bad = type_violations(out, mxmp.Policy(target), given_dtypes(target, data_lp))
        assert not bad, (target, cast_params, bad)


@FUZZ
@given(fg=graphs(), data_lp=st.booleans())
def test_no_tensor_is_cast_twice_to_one_dtype_or_cast_to_its_own_dtype(fg, data_lp):
    sym = fg.build()
    for target, cast_params in CONFIGS:
        given_ = given_dtypes(target, data_lp)
        real = convert(sym, target, cast_params, data_lp=data_lp)
        assert not cast_violations(real, given_), (target, cast_params)
        emulated = convert(sym, target, cast_params, emulate=True, data_lp=data_lp)
        # emulation keeps float32 -> float32 casts where the real graph up-casts
        assert not cast_violations(emulated, given_, real=False), (target, cast_params)


@FUZZ
@given(fg=graphs(), data_lp=st.booleans())
def test_emulated_graph_rounds_exactly_the_real_graphs_low_precision_tensors(fg, data_lp):
    sym = fg.build()
    for target, cast_params in CONFIGS:
        given_ = given_dtypes(target, data_lp)
        real = convert(sym, target, cast_params, data_lp=data_lp)
        emulated = convert(sym, target, cast_params, emulate=True, data_lp=data_lp)
        bad = emulation_violations(real, emulated, mxmp.Policy(target), given_)
        assert not bad, (target, cast_params, bad)


@FUZZ
@given(fg=graphs(), data_lp=st.booleans())
def test_emulated_graph_runs_and_matches_float32_within_target_dtype_tolerance(fg, data_lp):
    sym = fg.build()
    args, aux = make_args(fg, sym)
    for target, cast_params in CONFIGS:
        given_ = given_dtypes(target, data_lp)
        out = convert(sym, target, cast_params, emulate=True, data_lp=data_lp)
        # Arguments whose dtype the converted graph fixed (cast_params, low-precision data)
        # are fed in that dtype; the float32 reference sees the same rounded values.
        js, dtypes = entry_dtypes(out, given_)
        low_args = {n['name']: dtypes[(i, 0)] for i, n in enumerate(js['nodes'])
                    if n['op'] == 'null' and dtypes[(i, 0)] in LOW}
        lp_args = {k: to_dtype(v, low_args[k]) if k in low_args else v
                   for k, v in args.items()}
        ref_args = {k: to_dtype(v, 'float32') if k in low_args else v
                    for k, v in lp_args.items()}
        ref = [o.asnumpy().astype(np.float64) for o in forward(sym, ref_args, aux)]
        scales = error_scales(sym, ref_args, aux)
        got = forward(out, lp_args, aux)
        # outputs that are low precision in the real graph (cast to float32 at the end)
        real = convert(sym, target, cast_params, data_lp=data_lp)
        rjs, rtypes = entry_dtypes(real, given_)
        low_heads = [rjs['nodes'][h[0]]['op'] == 'amp_cast' and
                     rtypes[tuple(rjs['nodes'][h[0]]['inputs'][0][:2])] in LOW
                     for h in rjs['heads']]
        assert len(got) == len(ref)
        for k, (g, r) in enumerate(zip(got, ref)):
            assert g.dtype == np.float32, (target, cast_params, k, g.dtype)
            assert g.shape == r.shape
            g = g.asnumpy()
            worst = mismatch(g, r, scales[k], EPS[target], fg.depth[k])
            assert worst is None, ('output %d off by %.3g x the tolerance' % (k, worst),
                                   target, cast_params)
            if low_heads[k]:  # it was rounded: every value is one of the target dtype
                assert representable(g, target), ('output %d not rounded' % k, target,
                                                  cast_params)


@FUZZ
@given(fg=graphs(), data_lp=st.booleans())
def test_converting_a_converted_graph_changes_nothing(fg, data_lp):
    sym = fg.build()
    for target, cast_params in CONFIGS:
        for emulate in (False, True):
            once = convert(sym, target, cast_params, emulate, data_lp)
            twice = convert(once, target, cast_params, emulate, data_lp)
            assert twice.tojson(remove_amp_cast=False) == once.tojson(remove_amp_cast=False), \
                (target, cast_params, emulate)


@FUZZ
@given(fg=graphs(), data_lp=st.booleans())
def test_remove_casts_gives_back_the_float32_graph(fg, data_lp):
    sym = fg.build()
    for target, cast_params in CONFIGS:
        for emulate in (False, True):
            out = convert(sym, target, cast_params, emulate, data_lp)
            assert mxmp.remove_casts(out).tojson() == sym.tojson(), (target, cast_params,
                                                                       emulate)


#: Overrides the fuzzing may apply: ops whose MXNet kernels are dtype-generic (safe in lp_ops),
#: and ops that can always compute in float32 (safe in fp32_ops).
_LP_OVERRIDES = ('Activation', 'Pooling', 'Reshape', 'transpose', 'elemwise_add', 'Concat',
                 'add_n', 'SliceChannel')
_FP32_OVERRIDES = ('FullyConnected', 'Convolution', 'BatchNorm', 'LeakyReLU', 'broadcast_mul',
                   'Flatten')


@st.composite
def policies(draw, fg):
    """A Policy for ``fg`` with random overrides: lp_ops, fp32_ops, excluded node names."""
    names = sorted(s.out for s in fg.steps if s.op != 'var')
    return mxmp.Policy(draw(st.sampled_from(TARGETS)),
                       lp_ops=draw(st.sets(st.sampled_from(_LP_OVERRIDES), max_size=3)),
                       fp32_ops=draw(st.sets(st.sampled_from(_FP32_OVERRIDES), max_size=2)),
                       excluded_names=draw(st.sets(st.sampled_from(names), max_size=2)))


@FUZZ
@given(data=st.data())
def test_policy_overrides_are_obeyed_and_explain_matches_the_converted_graph(data):
    fg = data.draw(graphs(), label='fg')
    policy = data.draw(policies(fg), label='policy')
    cast_params = data.draw(st.booleans(), label='cast_params')
    sym = fg.build()
    out = mxmp.convert_symbol(sym, policy=policy, cast_params=cast_params)
    assert type_violations(out, policy) == []
    assert cast_violations(out) == []
    # the overrides themselves, without Policy.classify: excluded names and fp32_ops compute
    # in float32, lp_ops in the target dtype
    js, dtypes = entry_dtypes(out)
    for node in js['nodes']:
        if node['op'] in ('null', 'amp_cast'):
            continue
        skip = set(policy.index_inputs(node['op'])) | set(policy.float32_inputs(node['op']))
        ins = {dtypes[(e[0], e[1])] for p, e in enumerate(node['inputs']) if p not in skip}
        ins &= set(RANK)
        if node['name'] in policy.excluded_names or node['op'] in policy.fp32_ops:
            assert ins <= {'float32'}, (node['name'], ins)
        elif node['op'] in policy.lp_ops:
            assert ins <= {policy.target_dtype}, (node['name'], ins)
    again = mxmp.convert_symbol(out, policy=policy, cast_params=cast_params)
    assert again.tojson(remove_amp_cast=False) == out.tojson(remove_amp_cast=False)
    assert mxmp.remove_casts(out).tojson() == sym.tojson()
    # explain: the dtype it reports for every op node is the dtype of its first output
    js, dtypes = entry_dtypes(out)
    nid_of = {n['name']: i for i, n in enumerate(js['nodes'])}
    for row in mxmp.explain(sym, policy=policy, cast_params=cast_params):
        if row.op != 'null':
            have = dtypes[(nid_of[row.name], 0)]
            assert row.dtype == (have if have in RANK else None), row


@FUZZ
@given(fg=graphs())
def test_converting_a_graph_built_twice_gives_identical_json(fg):
    for target, cast_params in CONFIGS:
        for emulate in (False, True):
            a = convert(fg.build(), target, cast_params, emulate)
            b = convert(fg.build(), target, cast_params, emulate)
            assert a.tojson(remove_amp_cast=False) == b.tojson(remove_amp_cast=False)


# =============================================================================================
# The checkers catch what they are meant to catch (hand-made bad graphs)
# =============================================================================================
def _cast(x, dtype, name):
    return mx.sym.amp_cast(x, dtype=_bf16() if dtype == 'bfloat16' else dtype, name=name,
                           attr={MARK: 'cast'})


def test_cast_check_catches_a_tensor_cast_twice_to_one_dtype():
    data, w = mx.sym.var('data'), mx.sym.var('w', attr={'__dtype__': '12'})
    a = mx.sym.FullyConnected(_cast(data, 'bfloat16', 'c1'), w, num_hidden=2, no_bias=True,
                              name='a')
    b = mx.sym.FullyConnected(_cast(data, 'bfloat16', 'c2'), w, num_hidden=2, no_bias=True,
                              name='b')
    bad = cast_violations(mx.sym.Group([a, b]))
    assert len(bad) == 1 and 'c1 and c2 both cast data:0 to bfloat16' in bad[0]


def test_cast_check_catches_a_cast_to_the_dtype_a_tensor_already_has():
    data = mx.sym.var('data')
    bad = cast_violations(mx.sym.relu(_cast(data, 'float32', 'noop'), name='r'))
    assert bad == ['noop casts data:0, already float32, to float32']
    assert cast_violations(mx.sym.relu(_cast(data, 'float32', 'noop'), name='r'),
                           real=False) == []


def test_type_check_catches_low_precision_op_fed_float32():
    data = mx.sym.var('data')
    sym = mx.sym.FullyConnected(data, num_hidden=2, no_bias=True, name='fc')
    bad = type_violations(sym, mxmp.Policy('float16'))
    assert any('fc' in b and 'not float16' in b for b in bad)


def test_type_check_catches_low_precision_tensor_reaching_a_float32_op_or_the_output():
    data = mx.sym.var('data')
    weight = mx.sym.var('w', attr={'__dtype__': '12'})  # stored in bfloat16
    fc = mx.sym.FullyConnected(_cast(data, 'bfloat16', 'c'), weight, num_hidden=2, no_bias=True,
                               name='fc')
    bad = type_violations(mx.sym.Group([mx.sym.softmax(fc, name='sm'), fc]),
                          mxmp.Policy('bfloat16'))
    assert any('sm' in b and 'low-precision input' in b for b in bad)
    assert any(b == 'output fc:0 is bfloat16' for b in bad)


def test_type_check_catches_a_follow_op_casting_its_input_down():
    data = mx.sym.var('data')
    policy = mxmp.Policy('bfloat16')
    relu = mx.sym.Activation(_cast(data, 'bfloat16', 'down'), act_type='relu', name='act')
    if policy.classify('Activation', {'act_type': 'relu'})[0] != FOLLOW:
        pytest.skip('Activation relu is not a follow op in this op list')
    bad = type_violations(mx.sym.Group([_cast(relu, 'float32', 'up')]), policy)
    assert any('act' in b and 'widest source is float32' in b for b in bad)


def test_emulation_check_catches_a_low_precision_tensor_that_is_not_rounded():
    data = mx.sym.var('data')
    real = mxmp.convert_symbol(mx.sym.FullyConnected(data, num_hidden=2, name='fc'),
                               'bfloat16')
    emulated = mxmp.convert_symbol(mx.sym.FullyConnected(data, num_hidden=2, name='fc'),
                                   'bfloat16', emulate=True)
    assert emulation_violations(real, emulated, mxmp.Policy('bfloat16')) == []
    # The float32 graph run as if it were the emulation: nothing is rounded.
    plain = mx.sym.FullyConnected(data, num_hidden=2, name='fc')
    bad = emulation_violations(real, plain, mxmp.Policy('bfloat16'))
    assert any('fc input 0' in b for b in bad)


def test_representable_tells_rounded_values_from_float32_ones():
    x = np.random.RandomState(0).uniform(-1, 1, 100).astype(np.float32)
    assert not representable(x, 'float16') and not representable(x, 'bfloat16')
    assert representable(x.astype(np.float16).astype(np.float32), 'float16')
    assert representable(nd.amp_cast(nd.amp_cast(nd.array(x), dtype=_bf16()),
                                     dtype='float32').asnumpy(), 'bfloat16')
    assert representable(np.array([np.inf, 0, -2.0], np.float32), 'float16')


def test_tolerance_accepts_rounding_and_rejects_a_wrong_value():
    rng = np.random.RandomState(0)
    ref = rng.uniform(-1, 1, (4, 5))
    rounded = ref.astype(np.float16).astype(np.float32)
    assert mismatch(rounded, ref, 1.0, EPS['float16'], depth=1) is None
    assert mismatch((ref * 1.05).astype(np.float32), ref, 1.0, EPS['float16'], depth=3) > 1
    assert mismatch((ref * 1.3).astype(np.float32), ref, 1.0, EPS['bfloat16'], depth=3) > 1
    assert mismatch(np.full((1,), np.nan, np.float32), np.zeros(1), 1.0, 1.0, 1) is not None


def test_fuzz_graphs_cover_every_op_of_the_brief():
    """The strategy reaches every op family (a strategy that silently stopped producing an op
    would make the properties above vacuous for it)."""
    seen = set()

    @settings(max_examples=300, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(fg=graphs())
    def collect(fg):
        seen.update(s.op for s in fg.steps)
        seen.update('BatchNorm3' for s in fg.steps if s.kwargs.get('output_mean_var'))
        seen.update('int32 index' for s in fg.steps if s.kwargs.get('dtype') == 'int32')
        seen.update('float index' for s in fg.steps
                    if s.op == 'var' and s.out == 'idx' and 'dtype' not in s.kwargs)
        seen.update('act_' + s.kwargs['act_type'] for s in fg.steps if 'act_type' in s.kwargs)
    collect()
    expected = {'Convolution', 'FullyConnected', 'BatchNorm', 'BatchNorm3', 'Activation',
                'LeakyReLU', 'Pooling', 'elemwise_add', 'elemwise_mul', 'elemwise_sub',
                'broadcast_add', 'broadcast_mul', 'Concat', 'add_n', 'Reshape', 'Flatten',
                'slice', 'slice_axis', 'transpose', 'softmax', 'log_softmax', 'SoftmaxOutput',
                'dot', 'batch_dot', 'Dropout', 'Embedding', 'int32 index', 'float index',
                'LayerNorm', 'SliceChannel', '_plus_scalar', '_mul_scalar', 'exp', 'log',
                'sqrt', 'square', 'sum', 'mean'} | {
                    'act_' + a for a in ('relu', 'sigmoid', 'tanh', 'softrelu', 'softsign',
                                         'leaky', 'elu', 'prelu', 'gelu', 'selu')}
    assert expected - seen == set()
