"""Float32 master weights of a Module's low-precision parameters (``cast_params=True``).

With ``cast_params`` the executors hold some weights in float16/bfloat16 (no cast per
iteration); the optimizer updates float32 copies of them, the *master weights*
(:class:`mxmp._src.training.master_weights.MasterWeights`, one array per context), and writes
the rounded values back. :class:`MasterWeightsModule` keeps the host-side parameters of
``mx.mod.Module`` (``get_params``, checkpoints) equal to the master weights, and creates the
masters again from the float32 values whenever parameters are written (``init_params``,
``set_params``, a bind), so no precision is lost through the low-precision copies.
"""
import mxnet as mx
from mxnet import nd

__all__ = ['MasterWeightsModule']


class MasterWeightsModule(mx.mod.Module):
    """``mx.mod.Module`` whose low-precision parameters have float32 master weights (base of
    :class:`mxmp.Module`).

    A subclass sets ``_lp_names`` (frozenset of the parameter names stored in low precision)
    and ``_step`` (a :class:`mxmp._src.training.step.Step`, whose ``masters`` attribute is the
    :class:`mxmp._src.training.master_weights.MasterWeights` by parameter name) before binding.
    """

    _lp_names = frozenset()

    def master_weights(self, name):
        """The float32 master weights of a low-precision parameter (``cast_params=True``).

        Args:
            name (str): parameter name.

        Returns:
            list of NDArray: float32, one per context, the live arrays the optimizer updates.

        Raises:
            ValueError: ``name`` is not stored in low precision, or parameters are not
                initialized yet.
        """
        if name not in self._lp_names:
            raise ValueError('parameter %r has no master weights: only the parameters stored '
                             'in the target dtype (cast_params=True) have them: %s'
                             % (name, sorted(self._lp_names)))
        if not (self.binded and self.params_initialized):
            raise ValueError('bind and initialize the Module before asking for master weights')
        return self._step.masters.get(name, self._device_arrays(name), track=False)

    def _device_arrays(self, name):
        group = self._exec_group
        return group.param_arrays[group.param_names.index(name)]

    def _params_written(self, values):
        """The device parameters were just written from ``values``: new master weights."""
        if not self._lp_names or values is None:
            return
        masters = self._step.masters
        for name in self._lp_names:
            if name in values and name in self._exec_group.param_names:
                masters.set_pending(name, values[name])
                masters.get(name, self._device_arrays(name), track=False)

    def _params_bound(self, fresh):
        """After a bind: the host copies of a ``fresh`` Module's low-precision parameters are
        float32 (initializers cannot fill bfloat16); bound initialized parameters get masters."""
        if fresh and not self.params_initialized:
            for name in self._lp_names:
                arr = self._arg_params[name]
                self._arg_params[name] = nd.zeros(arr.shape, dtype='float32')
        elif self.params_initialized:
            self._params_written(self._arg_params)

    def init_params(self, initializer=mx.init.Uniform(0.01), arg_params=None, aux_params=None,
                    allow_missing=False, force_init=False, allow_extra=False):
        """Initialize parameters, as ``mx.mod.Module.init_params``; master weights follow."""
        if self.params_initialized and not force_init:
            return super().init_params(initializer, arg_params, aux_params, allow_missing,
                                       force_init, allow_extra)
        super().init_params(initializer, arg_params, aux_params, allow_missing, force_init,
                            allow_extra)
        self._params_written(self._arg_params)
        return None

    def set_params(self, arg_params, aux_params, allow_missing=False, force_init=True,
                   allow_extra=False):
        """Assign parameters, as ``mx.mod.Module.set_params``; master weights follow.

        Give float32 values: a low-precision parameter's master weight is the given value.
        """
        ignored = self.params_initialized and not force_init
        super().set_params(arg_params, aux_params, allow_missing, force_init, allow_extra)
        if allow_missing and not ignored:
            self._params_written(arg_params)

    def _sync_params_from_devices(self):
        # BatchNorm writes its moving mean/var in the backward pass on CPU, outside the
        # engine's dependency tracking of the aux arrays: without a wait the copy can read
        # the statistics of the previous step (seen as a resumed run off by one update).
        nd.waitall()
        super()._sync_params_from_devices()
        for name in self._lp_names:
            master = self._step.masters.first_device(name)
            if isinstance(master, nd.NDArray):
                master.copyto(self._arg_params[name])
