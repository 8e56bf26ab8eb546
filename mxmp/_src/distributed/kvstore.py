"""mxmp.Trainer's use of MXNet's kvstore: its checks, the initial broadcast, the gradient reduction.

:class:`KVStoreMixin` is the part of :class:`mxmp.Trainer` that talks to the kvstore (MXNet
1.9.1, ``python/mxnet/gluon/trainer.py`` for what it replaces): the kvstore only reduces the
gradients (``update_on_kvstore`` is always False, so every worker checks the reduced gradients
for overflow before its own update), the initial weights come from worker 0 through
:func:`mxmp._src.distributed.broadcast.broadcast_from_root`, and gradients travel in their exchange
dtype (:mod:`mxmp._src.distributed.exchange`).
"""
import logging

from mxnet import autograd, nd

from ..dtypes import dtype_name
from ..device import to_default_layout
from .broadcast import broadcast_from_root
from .exchange import bytes_per_step, exchange_dtype, wire_dtype

__all__ = ['KVStoreMixin', 'check_kvstore_args']

# the Trainer's logger: users filter on 'mxmp._src.trainer'
logger = logging.getLogger('mxmp.trainer')


def check_kvstore_args(kvstore, update_on_kvstore):
    """The kvstore type of a Trainer's arguments, after refusing what mxmp cannot do.

    Args:
        kvstore (str or KVStore or None): as for ``gluon.Trainer``.
        update_on_kvstore (None or bool): as for ``gluon.Trainer``.

    Returns:
        str or None: the kvstore type (``'device'``, ``'dist_sync'`` ...).

    Raises:
        ValueError: ``update_on_kvstore=True`` or an asynchronous kvstore; the message says
            why and what to pass instead.
    """
    if update_on_kvstore:
        raise ValueError(
            'mxmp.Trainer cannot update on the kvstore (update_on_kvstore=True): it must '
            'see the reduced gradients to check them for inf/NaN and to update the float32 '
            'master weights before the optimizer runs. Pass update_on_kvstore=None or False '
            '(the gradients are still reduced by the kvstore).')
    kv_type = kvstore if isinstance(kvstore, str) else getattr(kvstore, 'type', '')
    if 'async' in (kv_type or ''):
        raise ValueError(
            'mxmp.Trainer does not support the asynchronous kvstore %r: async training '
            'updates on the kvstore, where overflow cannot be checked. Use a synchronous '
            "kvstore ('device', 'local', 'dist_sync', 'dist_device_sync')." % (kv_type,))
    return kv_type


class KVStoreMixin:
    """The kvstore glue of :class:`mxmp.Trainer` (a mixin before ``gluon.Trainer``).

    Needs the Trainer's ``_grad_dtype`` (checked ``grad_dtype``), ``_exchange``
    (:class:`mxmp._src.distributed.exchange.GradientExchange`) and ``_param_index``.
    """

    def _init_kvstore(self):
        super()._init_kvstore()
        if self._kvstore is not None and getattr(self, '_asked_update_on_kvstore', 0) is None:
            logger.info('mxmp.Trainer: update_on_kvstore=False on the %r kvstore (gluon\'s '
                        'default there is True): the kvstore only reduces the gradients; every '
                        'worker checks the reduced gradients for overflow and updates its own '
                        'weights', self._kvstore.type)

    def _init_params(self):
        # gluon.Trainer broadcasts worker 0's initial weights lazily, at the first step, with an
        # *asynchronous* pull on key i, and then pushes and pulls the gradient on the same key i.
        # The two touch different NDArrays, so MXNet's engine does not order them; on a dist
        # kvstore the server's value of key i is the initial weight until the first gradient
        # round completes and the gradient sum afterwards, so a weight pull served late writes
        # the *summed gradient into the weight* (the flaky "workers differ" failure of issue 6).
        # Waiting for the broadcast before any gradient is pushed makes every pull see the
        # weights: no worker pushes a gradient of key i before its own pull of key i returned.
        # The broadcast goes through a fresh copy in the kvstore's dtype, not the live weight
        # array as in gluon: bfloat16 would abort the parameter server (float32 travels instead),
        # and after a forward pass a weight held in oneDNN's layout was never stored by the
        # server ("init 4 first" from kvstore_dist_server.h, with gluon.Trainer as well):
        # mxmp._src.distributed.broadcast.
        kv, todo = self._kvstore, [p for p in self._params_to_init if not p._deferred_init]
        if kv is not None and self._distributed:
            ready = [p for p in self._params_to_init
                     if not p._deferred_init and p._stype == 'default']

            def send(idx, wire):
                kv.init(idx, wire)
                kv.pull(idx, out=wire)
            entries, low = [], []
            for p in ready:
                idx = self._param2idx[p.name]
                if self._is_low_precision(p):
                    # the root's float32 value (the one it makes its master weight from) travels,
                    # so that every worker's master weights are the same, not only the weights
                    source = _float32_source(p)
                    low.append((idx, p, source))
                    entries.append((idx, source))
                else:
                    entries.append((idx, p.list_data()))
            broadcast_from_root(entries, send, lambda own: wire_dtype(own, kv.type))
            with autograd.pause():
                for idx, p, source in low:
                    for arr, value in zip(p.list_data(), source):
                        nd.amp_cast(value, dtype=arr.dtype, out=arr)
                    self._masters.set_pending(idx, source[0])
            self._params_to_init = [p for p in self._params_to_init if p not in ready]
        super()._init_params()
        for param in todo:
            for arr in param.list_data():
                arr.wait_to_read()

    def _allreduce_grads(self):
        kv = self._kvstore
        if not kv:
            return
        for i, param in enumerate(self._params):
            if param.grad_req == 'null':
                continue
            grads = param.list_grad()
            own = dtype_name(param.dtype)
            dtype = self.exchange_dtype(param)
            if grads[0].stype != 'default':   # as gluon.Trainer (sparse: own dtype only)
                kv.push(i, grads, priority=-i)
                if param._stype == 'default':
                    kv.pull(i, grads, priority=-i, ignore_sparse=self._distributed)
            elif dtype == own:
                kv.pushpull(i, grads, priority=-i)
            else:
                self._exchange.pushpull(kv, i, grads, dtype,
                                        wire_dtype(own, kv.type) == dtype, -i)

    @property
    def num_workers(self) -> int:
        """int: number of workers of the kvstore (1 without a kvstore). Creates the kvstore."""
        if not self._kv_initialized:
            self._init_kvstore()
        return self._kvstore.num_workers if self._kvstore else 1

    def exchange_dtype(self, param):
        """The dtype a Parameter's gradient travels in over the kvstore (see ``grad_dtype``).

        Args:
            param (Parameter or str): a Parameter of this Trainer, or its name.

        Returns:
            str: ``'float32'``, ``'float16'`` or ``'bfloat16'``; the gradient's own dtype when
            there is no kvstore (nothing is exchanged).

        Raises:
            ValueError: the Parameter is not in this Trainer.
        """
        p = self._params[self._param_index(param)]
        if not self._kv_initialized:
            self._init_kvstore()
        own = dtype_name(p.dtype)
        if not self._kvstore:
            return own
        return exchange_dtype(own, self._grad_dtype, self._kvstore.type)

    def bytes_pushed_per_step(self):
        """Gradient bytes this worker pushes to the kvstore per step (0 without a kvstore).

        The sum over Parameters with ``grad_req != 'null'`` of elements x bytes per element of
        :meth:`exchange_dtype`: what one worker sends after its devices' gradients are summed
        (``dist_sync`` pulls the same amount back). Parameters whose shape is not known yet
        (deferred initialisation) count 0.
        """
        if not self._kv_initialized:
            self._init_kvstore()
        if not self._kvstore:
            return 0
        return bytes_per_step(self._params, self.exchange_dtype)


def _float32_source(param):
    """float32 arrays (one per device) of a low-precision Parameter's full-precision value: the
    values it held before ``cast_params`` rounded it where they are still its value
    (:func:`mxmp._src.gluon_graph.unrounded_values`), else its values widened."""
    from ..gluon_graph import unrounded_values
    arrays = unrounded_values(param)
    if arrays is not None:
        return [a.copy() for a in arrays]
    with autograd.pause():
        to_default_layout(param.list_data())
        return [nd.amp_cast(a, dtype='float32') for a in param.list_data()]
