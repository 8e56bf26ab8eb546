"""Training with mixed precision: the one training step (``step``), float32 master weights
(``master_weights``), the Trainer (``trainer``, states file in ``checkpoint``), the Module
(``module`` with its ``module_parts`` and ``module_checkpoint`` files), the BucketingModule
(``bucketing``) and the optimizer's updater (``updater``).
"""
