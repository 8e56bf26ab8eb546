"""The loss-scale input of a Module's executors: the scale ``S`` written where the graph reads it.

:func:`mxmp._src.graph.loss_heads.insert_loss_scale` gives the bound graph one input variable,
:data:`~mxmp._src.graph.loss_heads.LOSS_SCALE_NAME` (shape ``(1,)``, float32), that multiplies the
gradient of every loss op. :class:`LossScaleInputModule` binds it as a Module *state* and keeps
it equal to the current loss scale without rebinding: written before every forward and
backward pass when the scale or the executors changed (one small copy per context then,
nothing otherwise). User-facing values stay in the user's units: ``out_grads`` are multiplied
by ``S``, input gradients divided by it, and the state lists leave the input out.
"""
import mxnet as mx
from mxnet import nd

from ..graph.loss_heads import LOSS_SCALE_NAME

__all__ = ['LossScaleInputModule']


class LossScaleInputModule(mx.mod.Module):
    """``mx.mod.Module`` whose last state is the loss-scale input (base of :class:`mxmp.Module`).

    A subclass provides :attr:`loss_scaler` (the current :class:`mxmp.LossScaler`) and
    sets ``_scale_nodes`` (the number of loss-scale nodes of the bound graph; 0: no input)
    before ``mx.mod.Module.__init__``; it calls :meth:`_write_loss_scale` after anything that
    may change the scale or the executors.
    """

    _scale_nodes = 0
    _written_scale = None   # (arrays written, value) of the last write

    @property
    def loss_scale_nodes(self) -> int:
        """int: number of loss-scale nodes in the bound graph (0 when scaling is disabled)."""
        return self._scale_nodes

    def _write_loss_scale(self, force=False):
        """Write the current loss scale into every executor's input (when it changed, or
        always with ``force``)."""
        if not self._scale_nodes or not self.binded:
            return
        arrays = [e.arg_dict[LOSS_SCALE_NAME] for e in self._exec_group.execs]
        scale = float(self.loss_scaler.scale)
        if self._written_scale is not None and not force:
            old_arrays, old_scale = self._written_scale
            if old_scale == scale and len(old_arrays) == len(arrays) and \
                    all(a is b for a, b in zip(old_arrays, arrays)):
                return
        for arr in arrays:
            arr[:] = scale
        self._written_scale = (arrays, scale)

    def reshape(self, data_shapes, label_shapes=None):
        """Reshape the executors, as ``mx.mod.Module.reshape`` (the loss scale is kept)."""
        super().reshape(data_shapes, label_shapes)
        self._write_loss_scale()

    def forward(self, data_batch, is_train=None):
        """Forward, as ``mx.mod.Module.forward`` (outputs bit-identical to no loss scaling)."""
        self._write_loss_scale()
        super().forward(data_batch, is_train)

    def backward(self, out_grads=None):
        """Backward with the loss scale applied.

        Args:
            out_grads (NDArray or list of NDArray or None): gradients of outputs that are not
                loss ops, in the user's units; they are multiplied by the loss scale here
                (a power of two: exact).
        """
        self._write_loss_scale()
        if out_grads is not None and self.loss_scaler.enabled:
            scale = float(self.loss_scaler.scale)
            if isinstance(out_grads, nd.NDArray):
                out_grads = [out_grads]
            out_grads = [g * scale for g in out_grads]
        super().backward(out_grads)

    def get_input_grads(self, merge_multi_context=True):
        """Input gradients, as ``mx.mod.Module.get_input_grads``, divided by the loss scale."""
        grads = super().get_input_grads(merge_multi_context)
        if not self.loss_scaler.enabled:
            return grads
        scale = float(self.loss_scaler.scale)
        if merge_multi_context:
            return [g / scale for g in grads]
        return [[g / scale for g in per_ctx] for per_ctx in grads]

    def get_states(self, merge_multi_context=True):
        """States, as ``mx.mod.Module.get_states``, without the loss-scale input."""
        states = super().get_states(merge_multi_context)
        return states[:-1] if self._scale_nodes else states

    def set_states(self, states=None, value=None):
        """Set states, as ``mx.mod.Module.set_states``; the loss-scale input is kept."""
        super().set_states(states, value)
        self._write_loss_scale(force=True)
