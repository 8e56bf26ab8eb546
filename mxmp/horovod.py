"""Horovod for mxmp: :class:`DistributedTrainer`, an :class:`mxmp.Trainer` reduced by Horovod.

Import it explicitly (``from mxmp._src.horovod import DistributedTrainer``): ``import mxmp`` never
imports this module, and this module imports ``horovod.mxnet`` only when a trainer is created,
so mxmp works without Horovod. Horovod must be built against the installed MXNet; for mxnet
1.9.1 from PyPI on a CPU machine without MPI (measured, horovod 0.28.1, Python 3.11)::

    pip install mxnet==1.9.1 'numpy<1.24' 'cmake<4' wheel setuptools
    HOROVOD_WITH_MXNET=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITH_GLOO=1 \\
    HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 \\
        pip install --no-build-isolation horovod==0.28.1

(``--no-build-isolation``: Horovod's CMake imports mxnet to find ``libmxnet.so``; ``cmake<4``:
CMake 4 refuses Gloo's ``cmake_minimum_required``.) Run with ``horovodrun --gloo -np 2 -H
localhost:2 python train.py``; see ``docs/distributed.md``.

Why a subclass of :class:`mxmp.Trainer` and not of ``hvd.DistributedTrainer``: Horovod's
trainer (0.28.1, ``horovod/mxnet/__init__.py``) is ``gluon.Trainer`` with ``kvstore=None`` and
a ``_allreduce_grads`` that all-reduces every gradient in place and averages it (with
``op=Average``, or, on CPU/ROCm/old-NCCL builds such as ours, a sum and a ``_scale`` divided by
the number of workers). Its ``step``/``update`` are gluon's, which would update without mxmp's
overflow check and master weights, and its ``__init__(params, optimizer, optimizer_params,
compression, gradient_predivide_factor, prefix, num_groups, process_set)`` does not take the
arguments ``mxmp.Trainer`` passes to ``gluon.Trainer`` (``kvstore``, ``update_on_kvstore``),
so the two cannot be combined by multiple inheritance. The reduction is the only part needed,
and it is a few lines: this class keeps mxmp.Trainer's step (reduce -> one overflow check ->
update of the master weights) and replaces only the reduction, exactly where the kvstore's
``pushpull`` runs for ``dist_sync``. Every worker then checks the same summed gradients, so
all workers skip the same steps and keep the same loss scale without exchanging a flag; an inf
on one worker is inf (or NaN) in the sum on every worker.
"""
from mxnet import autograd

from ._src.dtypes import dtype_name
from ._src.gluon_graph import unrounded_values
from ._src.training.trainer import Trainer
from ._src.distributed import exchange as _exchange
from ._src.distributed.broadcast import broadcast_from_root

__all__ = ['DistributedTrainer', 'import_horovod']

_BUILD_HINT = (
    'build Horovod against the installed mxnet: pip install "cmake<4" wheel setuptools, then '
    'HOROVOD_WITH_MXNET=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITH_GLOO=1 '
    'HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 '
    'pip install --no-build-isolation horovod==0.28.1 (see docs/distributed.md)')


def import_horovod():
    """Return ``horovod.mxnet`` (imported now).

    Raises:
        ImportError: Horovod is not installed or was built without MXNet support; the message
            says how to build it.
    """
    try:
        import horovod.mxnet as hvd
    except ImportError as err:
        raise ImportError('mxmp._src.horovod needs horovod.mxnet (%s): %s' % (err, _BUILD_HINT)) \
            from err
    return hvd


class DistributedTrainer(Trainer):
    """:class:`mxmp.Trainer` whose gradients are summed over the Horovod workers.

    A drop-in for ``hvd.DistributedTrainer`` (Horovod 0.28, ``horovod/mxnet/__init__.py``)
    with mxmp's loss scaling, overflow check and float32 master weights. Call ``hvd.init()``
    first; one process per device (Horovod's model).

    Args:
        params (ParameterDict, dict or list of Parameter): as for :class:`mxmp.Trainer`. Every
            Parameter must live on exactly one context.
        optimizer (str or mx.optimizer.Optimizer): as for :class:`mxmp.Trainer`.
        optimizer_params (dict or None): as for :class:`mxmp.Trainer`.
        loss_scaler (keyword-only): as for :class:`mxmp.Trainer` (default: dynamic for float16,
            none for bfloat16/float32).
        target_dtype (keyword-only, str or None): as for :class:`mxmp.Trainer`.
        grad_dtype (keyword-only, None, ``'float32'`` or ``'float16'``): the dtype gradients are
            summed in (Horovod's ``Compression.fp16`` for ``'float16'``, which needs a dynamic
            loss scaler: an overflow of the float16 sum arrives as inf and the check backs the
            scale off). None (default): each gradient's own dtype, except bfloat16 gradients
            (``cast_params=True``), which travel as float32: Horovod's MXNet binding has no
            bfloat16 ("GetDType: Type 12 is not supported"). ``'bfloat16'`` is refused for
            the same reason.
        root_rank (keyword-only, int): the worker whose Parameter values every worker starts
            from (default 0).
        prefix (keyword-only, str): prefix of the Horovod tensor names (``<prefix>grad.<i>``,
            ``<prefix>weight.<i>``, ``i`` the Parameter's index), for several trainers in one
            job; default ``'mxmp.'``.

    Raises:
        ImportError: ``horovod.mxnet`` cannot be imported (the message says how to build it).
        ValueError: ``grad_dtype`` not None/``'float32'``/``'float16'``, or ``'float16'``
            without a dynamic loss scaler; plus everything :class:`mxmp.Trainer` raises.

    Behaviour:

    * **initial weights**: at construction every initialised Parameter is broadcast from
      ``root_rank`` (bfloat16 ones through float32), like ``hvd.broadcast_parameters``, so
      there is no separate call; Parameters with deferred initialisation are broadcast before
      the first reduction (that first step's gradients come from each worker's own values;
      after it every worker holds the same weights). Master weights are made after the
      broadcast;
    * **the step**: ``step(batch_size)`` all-reduces every gradient in place (a sum,
      ``hvd.allreduce_``), then runs :meth:`mxmp.Trainer.step`'s single overflow check on the
      summed gradients, and updates the master weights unless they overflowed;
    * **batch size**: as in ``hvd.DistributedTrainer``, pass the batch size of **one worker**:
      ``rescale_grad`` is divided by the number of workers, so the summed gradient becomes the
      average and N workers on ``b`` rows take the step of one process on ``N * b`` rows.
      (mxmp's ``dist_sync`` Trainer instead takes the global batch, as gluon does there.);
    * the split step works as in gluon: :meth:`allreduce_grads`, optionally :meth:`unscale`
      and clipping, then :meth:`update`.

    Cost per step: one in-place all-reduce per Parameter (Horovod fuses them), plus for
    bfloat16 or ``grad_dtype``-cast gradients a cast buffer per Parameter and two casts; the
    one host synchronisation of the overflow check (dynamic scaler).
    """

    def __init__(self, params, optimizer, optimizer_params=None, *, loss_scaler=None,
                 target_dtype=None, grad_dtype=None, root_rank=0, prefix='mxmp.'):
        hvd = import_horovod()
        super().__init__(params, optimizer, optimizer_params, kvstore=None,
                         loss_scaler=loss_scaler, target_dtype=target_dtype)
        if grad_dtype is not None:
            name = _exchange.check_grad_dtype(grad_dtype, None, self._step.scaler.dynamic)
            if name == 'bfloat16':
                raise ValueError("grad_dtype='bfloat16' is not possible with Horovod: its MXNet "
                                 "binding reduces float16/float32/float64 only ('GetDType: "
                                 "Type 12 is not supported'). Use grad_dtype='float16' (with a "
                                 "dynamic loss scaler) or None")
            grad_dtype = name
        self._hvd = hvd
        self._grad_dtype = grad_dtype
        self._root_rank = int(root_rank)
        self._prefix = str(prefix)
        self._casts = _exchange.CastBuffers()   # param index -> cast buffer of the gradient
        self._scale /= hvd.size()   # the sum of N workers' gradients -> their mean
        self._to_broadcast = list(range(len(self._params)))
        self._broadcast_initialized()

    # ------------------------------------------------------------------ properties
    @property
    def num_workers(self) -> int:
        """int: the number of Horovod workers (``hvd.size()``)."""
        return self._hvd.size()

    @property
    def rank(self) -> int:
        """int: this worker's Horovod rank (``hvd.rank()``)."""
        return self._hvd.rank()

    def exchange_dtype(self, param):
        """The dtype a Parameter's gradient is summed in (see ``grad_dtype``).

        Args:
            param (Parameter or str): a Parameter of this Trainer, or its name.

        Returns:
            str: ``'float32'``, ``'float16'`` or ``'float64'`` (non-float gradients: their own).

        Raises:
            ValueError: the Parameter is not in this Trainer.
        """
        p = self._params[self._param_index(param)]
        return _exchange.exchange_dtype(dtype_name(p.dtype), self._grad_dtype, 'horovod')

    def bytes_pushed_per_step(self):
        """Gradient bytes this worker contributes to the all-reduce per step.

        The sum over Parameters with ``grad_req != 'null'`` of elements x bytes per element of
        :meth:`exchange_dtype` (what the kvstore trainer reports; Horovod's ring all-reduce
        moves about twice that per worker on the wire). Deferred Parameters count 0; 0 with one
        worker (nothing is reduced).
        """
        if self._hvd.size() == 1:
            return 0
        return _exchange.bytes_per_step(self._params, self.exchange_dtype)

    # ------------------------------------------------------------------ Horovod
    def _check_one_context(self, param):
        if len(param.list_ctx()) != 1:
            raise ValueError('mxmp._src.horovod.DistributedTrainer: Parameter %r lives on %d '
                             'contexts; Horovod runs one process per device. Initialise the '
                             'network on one context per process (e.g. mx.gpu(hvd.local_rank()))'
                             % (param.name, len(param.list_ctx())))

    def _broadcast_initialized(self):
        """Broadcast root_rank's values of every not yet broadcast, initialised Parameter."""
        hvd, pending, ready = self._hvd, [], []
        for i in self._to_broadcast:
            param = self._params[i]
            if param._data is None:     # deferred initialisation: later
                pending.append(i)
                continue
            self._check_one_context(param)
            if hvd.size() > 1:
                ready.append(('%sweight.%d' % (self._prefix, i), param.list_data()))
                self._masters.discard(i)   # re-made from the broadcast values
                # not from this worker's own unrounded values (cast_params): every worker's
                # master weights must be the same
                unrounded_values(param)

        def send(name, wire):
            hvd.broadcast_(wire, root_rank=self._root_rank, name=name)
        # bfloat16 travels as float32: Horovod's MXNet binding has no bfloat16
        broadcast_from_root(ready, send,
                            lambda own: _exchange.exchange_dtype(own, None, 'horovod'))
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
                bufs = self._casts.cast_in(i, grads, self.exchange_dtype(param))
                hvd.allreduce_(bufs[0], op=hvd.Sum, name='%sgrad.%d' % (self._prefix, i),
                               priority=-i)
                self._casts.cast_out(bufs, grads)
