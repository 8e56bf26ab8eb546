"""Training with mixed precision: the one training step and the wrappers that drive it.

The modules, one job each: ``step`` (overflow check, skip or step, master-weight write-back,
loss-scale update; the call order as an explicit stage), ``master_weights``, ``checkpoint``
(states files, atomic writes), ``trainer`` (:class:`mxmp.Trainer`), ``module``
(:class:`mxmp.Module`) with its parts ``module_checkpoint``, ``module_kvstore``,
``module_loss_scale`` and ``module_master_weights``, ``updater`` (the optimizer's updater: SGD on
a CPU one weight per kernel call), and ``bucketing``
(:class:`mxmp.BucketingModule`). The public names are re-exported by :mod:`mxmp`.
"""
