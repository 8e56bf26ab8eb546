"""Horovod for mxmp: :class:`DistributedTrainer`, an :class:`mxmp.Trainer` reduced by Horovod.

``import mxmp`` never imports this module, and this module imports ``horovod.mxnet`` only when a
trainer is created. How to build Horovod against mxnet 1.9.1, and why this is a subclass of
:class:`mxmp.Trainer` rather than of ``hvd.DistributedTrainer``: docs/distributed.md.
"""
from mxnet import autograd

from ._src import distributed
from ._src.training.trainer import Trainer

__all__ = ['DistributedTrainer', 'import_horovod']

_BUILD_HINT = (
    'build Horovod against the installed mxnet: pip install "cmake<4" wheel setuptools, then '
    'HOROVOD_WITH_MXNET=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITH_GLOO=1 '
    'HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 '
    'pip install --no-build-isolation horovod==0.28.1 (see docs/distributed.md)')


def import_horovod():
    """Return ``horovod.mxnet``; ImportError saying how to build it if it cannot be imported."""
    try:
        import horovod.mxnet as hvd
    except ImportError as err:
        raise ImportError('mxmp.horovod needs horovod.mxnet (%s): %s' % (err, _BUILD_HINT)) \
            from err
    return hvd


class DistributedTrainer(Trainer):
    """:class:`mxmp.Trainer` whose gradients are summed over the Horovod workers in place
    (``hvd.allreduce_``) before its one overflow check. Call ``hvd.init()`` first; one process
    per device.

    Args:
        params, optimizer, optimizer_params, loss_scaler, target_dtype, policy: as for
            :class:`mxmp.Trainer`; every Parameter must live on exactly one context.
        grad_dtype (keyword-only, None, ``'float32'`` or ``'float16'``): the dtype gradients are
            summed in (``'float16'`` needs a dynamic loss scaler); None: their own, except
            bfloat16 (float32: Horovod's MXNet binding has no bfloat16).
        root_rank (keyword-only, int): the worker whose initial values every worker takes
            (default 0). Initialised Parameters are broadcast at construction, deferred ones
            before the first reduction; a low-precision Parameter travels as root_rank's
            float32 master weight (made from the float32 values ``cast_params`` rounded), which
            becomes every worker's master and, rounded, its value.
        prefix (keyword-only, str): prefix of the Horovod tensor names (``<prefix>grad.<i>``,
            ``<prefix>weight.<i>``); default ``'mxmp.'``.

    Raises:
        ImportError: ``horovod.mxnet`` cannot be imported (the message says how to build it).
        ValueError: a ``grad_dtype`` other than None/``'float32'``/``'float16'``, or
            ``'float16'`` without a dynamic loss scaler; what :class:`mxmp.Trainer` raises.

    As ``hvd.DistributedTrainer``, ``batch_size`` is one worker's: ``rescale_grad`` is divided
    by the number of workers, so the sum becomes the mean. :meth:`exchange_dtype` and
    :meth:`bytes_pushed_per_step` are the Trainer's, over the all-reduce (0 bytes alone).
    """

    def __init__(self, params, optimizer, optimizer_params=None, *, loss_scaler=None,
                 target_dtype=None, grad_dtype=None, root_rank=0, prefix='mxmp.', policy=None):
        hvd = import_horovod()
        super().__init__(params, optimizer, optimizer_params, kvstore=None,
                         loss_scaler=loss_scaler, target_dtype=target_dtype, policy=policy)
        self._exchange.grad_dtype = distributed.check_grad_dtype(
            grad_dtype, 'horovod', self._step.scaler.dynamic)
        self._hvd = hvd
        self._root_rank = int(root_rank)
        self._prefix = str(prefix)
        self._scale /= hvd.size()   # the sum of N workers' gradients -> their mean
        self._to_broadcast = list(range(len(self._params)))
        self._broadcast_initialized()

    num_workers = property(lambda self: self._hvd.size(),
                           doc='int: the number of Horovod workers (``hvd.size()``).')
    rank = property(lambda self: self._hvd.rank(),
                    doc="int: this worker's Horovod rank (``hvd.rank()``).")

    def _reduction(self):
        """Horovod's all-reduce, into which one worker alone pushes nothing."""
        return 'horovod', self._hvd.size() > 1

    def _check_one_context(self, param):
        if len(param.list_ctx()) != 1:
            raise ValueError('mxmp.horovod.DistributedTrainer: Parameter %r lives on %d '
                             'contexts; Horovod runs one process per device. Initialise the '
                             'network on one context per process (e.g. mx.gpu(hvd.local_rank()))'
                             % (param.name, len(param.list_ctx())))

    def _broadcast_initialized(self):
        """Broadcast root_rank's values of every not yet broadcast, initialised Parameter
        (a low-precision one as root_rank's float32 master: every worker's master weights are
        the same, and those one process would make)."""
        hvd, pending, ready = self._hvd, [], []
        for i in self._to_broadcast:
            param = self._params[i]
            if param._data is None:     # deferred initialisation: later
                pending.append(i)
                continue
            self._check_one_context(param)
            ready.append(('%sweight.%d' % (self._prefix, i), i, param))

        def send(name, wire):
            hvd.broadcast_(wire, root_rank=self._root_rank, name=name)
        if hvd.size() > 1:
            distributed.broadcast_params(ready, self._masters, send, 'horovod')
        self._to_broadcast = pending

    def _allreduce_grads(self):
        if self._to_broadcast:
            self._broadcast_initialized()
        hvd = self._hvd
        if hvd.size() == 1:
            return
        with autograd.pause():
            for i, param in enumerate(self._params):
                if param.grad_req == 'null':
                    continue
                self._check_one_context(param)
                grads = param.list_grad()
                bufs = self._exchange.cast_in(i, grads, self.exchange_dtype(param))
                hvd.allreduce_(bufs[0], op=hvd.Sum, name='%sgrad.%d' % (self._prefix, i),
                               priority=-i)
                self._exchange.cast_out(bufs, grads)

