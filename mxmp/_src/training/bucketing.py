"""mxmp's BucketingModule: ``mx.mod.BucketingModule`` whose buckets are :class:`mxmp.Module` s."""
import mxnet as mx

from . import module_checkpoint as files
from .module import Module

__all__ = ['BucketingModule']


class BucketingModule(mx.mod.BucketingModule):
    """``mx.mod.BucketingModule`` whose buckets are :class:`Module` s.

    Args:
        sym_gen (returning float32 symbols), default_bucket_key, **kwargs: as for
            ``mx.mod.BucketingModule``.
        target_dtype, loss_scaler, cast_params, emulate, policy (keyword-only): as for
            :class:`Module`; every bucket is converted with them.

    All buckets share one optimizer, one loss scaler (one loss scale, one count of skipped
    steps) and one set of master weights. ``save_checkpoint`` writes MXNet's bucketing files
    (float32) plus ``prefix-%04d.mxmp.json``; :meth:`load` reads them back.
    """

    def __init__(self, sym_gen, default_bucket_key=None, *, target_dtype=None,
                 loss_scaler=None, cast_params=None, emulate='auto', policy=None, **kwargs):
        self._precision = dict(target_dtype=target_dtype, loss_scaler=loss_scaler,
                               cast_params=cast_params, emulate=emulate, policy=policy)
        super().__init__(sym_gen, default_bucket_key, **kwargs)
        self._reset_bind()

    def _make_module(self, bucket_key):
        symbol, data_names, label_names = self._call_sym_gen(bucket_key)
        return Module(symbol, data_names, label_names, logger=self.logger,
                      context=self._context, work_load_list=self._work_load_list,
                      fixed_param_names=self._fixed_param_names, state_names=self._state_names,
                      group2ctxs=self._group2ctxs, compression_params=self._compression_params,
                      **self._precision)

    def _reset_bind(self):
        """Unbind, as MXNet, but keep an mxmp Module (with the old one's loss scaler, skipped
        steps and master weights) in the default bucket, where MXNet's bind looks first."""
        old = self._buckets.get(self._default_bucket_key)
        super()._reset_bind()
        module = self._make_module(self._default_bucket_key)
        if old is not None:
            module._share(old)
        self._buckets[self._default_bucket_key] = module

    def switch_bucket(self, bucket_key, data_shapes, label_shapes=None):
        """Switch to a bucket, as ``mx.mod.BucketingModule.switch_bucket`` (mxmp Modules)."""
        assert self.binded, 'call bind before switching bucket'
        if bucket_key not in self._buckets:
            self._buckets[bucket_key] = self._make_module(bucket_key)
        super().switch_bucket(bucket_key, data_shapes, label_shapes)

    def update(self):
        """As ``mx.mod.BucketingModule.update``; returns what the current bucket's
        :meth:`mxmp.Module.update` does: False if the step was skipped (inf/NaN gradients)."""
        assert self.binded and self.params_initialized and self.optimizer_initialized
        self._params_dirty = True
        return self._curr_module.update()

    def _default_module(self):
        return self._buckets[self._default_bucket_key]

    loss_scaler = property(lambda self: self._default_module().loss_scaler,
                           doc='LossScaler: the loss scaler shared by all buckets.')
    loss_scale = property(lambda self: self._default_module().loss_scale,
                          doc='float: the current loss scale.')
    skipped_steps = property(lambda self: self._default_module().skipped_steps,
                             doc='int: updates skipped on overflow, all buckets together.')

    @staticmethod
    def load(prefix, epoch, sym_gen=None, default_bucket_key=None, **kwargs):
        """A BucketingModule from ``prefix-%04d.params`` and, if it exists,
        ``prefix-%04d.mxmp.json`` (as :meth:`mxmp.Module.load`), with the ``sym_gen`` and
        ``default_bucket_key`` used for training; parameters set, not bound. ValueError if
        they are missing or a file is bad."""
        if sym_gen is None or default_bucket_key is None:
            raise ValueError('BucketingModule.load needs the sym_gen and default_bucket_key '
                             'the model was trained with')
        _, args, auxs = files.load_params(prefix, epoch, with_symbol=False)
        state, state_file, kwargs = files.read_state(prefix, epoch, kwargs)
        mod = BucketingModule(sym_gen, default_bucket_key, **kwargs)
        mod._curr_module = mod._default_module()
        mod._curr_module.set_loaded(args, auxs, state, state_file)
        mod.params_initialized = True
        return mod

    def save_checkpoint(self, prefix, epoch, remove_amp_cast=True):
        """MXNet's bucketing checkpoint (float32) plus ``prefix-%04d.mxmp.json``."""
        super().save_checkpoint(prefix, epoch, remove_amp_cast=remove_amp_cast)
        files.write_state(prefix, epoch, self._default_module().mixed_precision_state())
