"""Old import path of the mixed-precision Symbolic Module: it moved to :mod:`mxmp.training.module`
(the class), :mod:`mxmp.training.module_checkpoint` and :mod:`mxmp.graph.loss_heads`."""
from .graph.loss_heads import HEAD_GRADIENT_LOSS_OPS, LOSS_SCALE_NAME, insert_loss_scale
from .training.module import Module
from .training.module_checkpoint import read_state

__all__ = ['Module', 'insert_loss_scale', 'LOSS_SCALE_NAME', 'HEAD_GRADIENT_LOSS_OPS',
           'read_state']
