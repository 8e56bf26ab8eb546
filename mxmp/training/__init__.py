"""Training with mixed precision: the one training step and the wrappers that drive it.

The modules, one job each: ``step`` (overflow check, skip or step, master-weight write-back,
loss-scale update; the call order as an explicit stage), ``master_weights``, ``trainer``
(:class:`mxmp.Trainer`), ``module`` (:class:`mxmp.Module`), ``bucketing``, ``checkpoint``
(states files, atomic writes). The public names are re-exported by :mod:`mxmp`.
"""
