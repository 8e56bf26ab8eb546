"""Worker of tests/gluon/test_gluoncv_models.py: one GluonCV detector trained as GluonCV trains it.

    python -m tests.gluon.gluoncv_worker MODEL MODE [--seed S] [--steps N]

MODEL is one of ``MODELS`` (SSD, YOLO3, Faster-RCNN, CenterNet; no pretrained weights), MODE one
of ``float32`` (no mxmp), ``convert`` (``net = mxmp.convert(net, 'bfloat16')`` right after the
network is built and initialized, then ``mxmp.Trainer``) or ``amp`` (``mxmp.amp.init(
target_dtype='bfloat16')`` before anything else, then ``gluon.Trainer`` with ``amp.init_trainer``
and ``amp.scale_loss``, as contrib.amp documents it). Run from the repository root; prints one
JSON line.

The training calls are the ones GluonCV's detection training scripts make, written here with
GluonCV's public API:

* the train transform with the network's own target generator (``SSDDefaultTrainTransform`` with
  the anchors of a train-mode call, ``YOLO3DefaultTrainTransform(net=net)``,
  ``FasterRCNNDefaultTrainTransform(net=net)`` + ``FasterRCNNTrainBatchify``,
  ``CenterNetDefaultTrainTransform``); SSD's and YOLO3's call the network, imperatively in
  float32 and ``amp`` modes (as in the scripts, before ``hybridize()``), through its graph in
  ``convert`` mode (``mxmp.convert`` hybridizes);
* ``net.hybridize()`` (SSD: ``static_alloc=True, static_shape=True``, as its script), then N
  steps (default 3) under ``autograd.record()`` with the training-mode call
  (SSD and CenterNet ``net(x)``, YOLO3 ``net(x, gt_boxes, *targets)`` returning its losses,
  Faster-RCNN ``net(x, gt_box, gt_label)`` returning predictions and sampled targets) and the
  matching GluonCV / Gluon losses, SGD (CenterNet: Adam) as in the scripts;
* validation: ``net.set_nms(...)``, ``net.hybridize()``, a predict-mode call on the val
  transform's output.

Sizes: SSD ``ssd_300_vgg16_atrous_voc`` at 300x300, YOLO3 ``yolo3_mobilenet1.0_voc`` at 256x256,
CenterNet ``center_net_resnet18_v1b_voc`` at 256x256, all batch 2; Faster-RCNN
``faster_rcnn_resnet50_v1b_voc`` batch 1 at 230x192 (short side 192).

After the last training call and after the validation call the worker reads the graph MXNet
executed (``net._cached_graph``) and counts the dtypes of every Convolution output there. Step
times are wall and process CPU seconds (``step_cpu_seconds``: not inflated by other jobs).

Inputs: two synthetic 192x160 images with 2-3 boxes each, the same for every mode (seeded). The
Python, NumPy and MXNet generators are reseeded before the transforms, before the Parameters
are initialized again (in one order for every mode, once the transforms' calls have given every
shape) and before training, so the weights, the augmentations and Faster-RCNN's samplers are
the same in every mode.
"""
import argparse
import json
import os
import random
import statistics
import time
import warnings

import numpy as np

import mxnet as mx
from mxnet import autograd, gluon

NUM_CLASSES = 20   # the VOC models
BFLOAT16 = np.dtype([('bfloat16', np.uint16)])   # MXNet's NumPy stand-in for bfloat16


def seed_all(seed):
    random.seed(seed)
    np.random.seed(seed)
    mx.random.seed(seed)


def images(seed, n=2, width=192, height=160):
    """n HWC uint8 images with filled boxes, and labels (xmin, ymin, xmax, ymax, class, 0)."""
    rng = np.random.RandomState(1000 + seed)
    out = []
    for _ in range(n):
        img = (rng.rand(height, width, 3) * 60 + rng.rand(3) * 120).astype(np.uint8)
        boxes = []
        for _ in range(rng.randint(2, 4)):
            bw, bh = rng.randint(width // 5, width // 2), rng.randint(height // 5, height // 2)
            x0, y0 = rng.randint(0, width - bw), rng.randint(0, height - bh)
            cls = rng.randint(NUM_CLASSES)
            img[y0:y0 + bh, x0:x0 + bw] = (np.array([37, 91, 53]) * (cls + 1)) % 255
            boxes.append([x0, y0, x0 + bw - 1, y0 + bh - 1, cls, 0])
        out.append((mx.nd.array(img, dtype='uint8'), np.array(boxes, dtype='float32')))
    return out


def stack(samples):
    """Batch samples (tuples of arrays) along a new first axis."""
    return [mx.nd.stack(*[mx.nd.array(s[i]) if not isinstance(s[i], mx.nd.NDArray) else s[i]
                          for s in samples]) for i in range(len(samples[0]))]


def total(losses):
    return sum(float(l.sum().asscalar()) for l in losses)


# --- the four detectors: build, data, one training forward, validation ---------------------------

class SSD:
    name = 'ssd_300_vgg16_atrous_voc'
    size = 300
    hybridize = {'static_alloc': True, 'static_shape': True}   # as GluonCV's SSD script

    def build(self):
        from gluoncv.model_zoo import get_model
        return get_model(self.name, pretrained=False, pretrained_base=False)

    def prepare(self, net, data):
        from gluoncv.data.transforms.presets.ssd import SSDDefaultTrainTransform
        import gluoncv as gcv
        with autograd.train_mode():   # the anchors, as GluonCV's scripts take them
            _, _, anchors = net(mx.nd.zeros((1, 3, self.size, self.size)))
        self.transform = SSDDefaultTrainTransform(self.size, self.size,
                                                  anchors.as_in_context(mx.cpu()))
        self.loss = gcv.loss.SSDMultiBoxLoss()

    def batch(self, data):
        return stack([self.transform(img, label) for img, label in data])

    def forward(self, net, batch):
        x, cls_targets, box_targets = batch
        cls_pred, box_pred, _ = net(x)
        sum_loss, cls_loss, box_loss = self.loss([cls_pred], [box_pred], [cls_targets],
                                                 [box_targets])
        return sum_loss, {'cls': total(cls_loss), 'box': total(box_loss)}

    def val_input(self, data):
        from gluoncv.data.transforms.presets.ssd import SSDDefaultValTransform
        t = SSDDefaultValTransform(self.size, self.size)
        return [mx.nd.stack(*[t(img, label)[0] for img, label in data])]

    def set_nms(self, net):
        net.set_nms(nms_thresh=0.45, nms_topk=400)


class SSDMobileNet(SSD):
    # BatchNorm after every layer, down to 1x1 maps: over a batch of 2 its training-mode
    # outputs are chaotic (float32 against itself), so the tests use the VGG-16 SSD
    name = 'ssd_512_mobilenet1.0_voc'
    size = 256


class YOLO3:
    name = 'yolo3_mobilenet1.0_voc'
    size = 256

    def build(self):
        from gluoncv.model_zoo import get_model
        return get_model(self.name, pretrained=False, pretrained_base=False)

    def prepare(self, net, data):
        from gluoncv.data.transforms.presets.yolo import YOLO3DefaultTrainTransform
        # calls net(zeros) in train mode for the anchors, offsets and feature maps
        self.transform = YOLO3DefaultTrainTransform(self.size, self.size, net)

    def batch(self, data):
        samples = [self.transform(img, label) for img, label in data]
        batch = stack([s[:6] for s in samples])
        # gt boxes padded with -1 to the longest
        n = max(s[6].shape[0] for s in samples)
        gt = np.full((len(samples), n, 4), -1, dtype='float32')
        for i, s in enumerate(samples):
            gt[i, :s[6].shape[0]] = np.asarray(s[6].asnumpy() if hasattr(s[6], 'asnumpy') else s[6])
        return batch + [mx.nd.array(gt)]

    def forward(self, net, batch):
        x, objectness, center_t, scale_t, weights, class_t, gt_boxes = batch
        obj, center, scale, cls = net(x, gt_boxes, objectness, center_t, scale_t, weights, class_t)
        return [obj + center + scale + cls], {'obj': total([obj]), 'center': total([center]),
                                              'scale': total([scale]), 'cls': total([cls])}

    def val_input(self, data):
        from gluoncv.data.transforms.presets.yolo import YOLO3DefaultValTransform
        t = YOLO3DefaultValTransform(self.size, self.size)
        return [mx.nd.stack(*[t(img, label)[0] for img, label in data])]

    def set_nms(self, net):
        net.set_nms(nms_thresh=0.45, nms_topk=400)


class FasterRCNN:
    name = 'faster_rcnn_resnet50_v1b_voc'
    # its RPN keeps 2000 proposals in training: the input needs >= 2000 anchors (15 per 16x16)
    short, max_size = 192, 240

    def build(self):
        from gluoncv.model_zoo import get_model
        return get_model(self.name, pretrained=False, pretrained_base=False)

    def prepare(self, net, data):
        from gluoncv.data.transforms.presets.rcnn import FasterRCNNDefaultTrainTransform
        from gluoncv.data.batchify import FasterRCNNTrainBatchify
        self.transform = FasterRCNNDefaultTrainTransform(self.short, self.max_size, net,
                                                         ashape=net.ashape)
        self.batchify = FasterRCNNTrainBatchify(net, 1)
        self.rpn_cls = gluon.loss.SigmoidBinaryCrossEntropyLoss(from_sigmoid=False)
        self.rpn_box = gluon.loss.HuberLoss(rho=1. / 9.)
        self.rcnn_cls = gluon.loss.SoftmaxCrossEntropyLoss()
        self.rcnn_box = gluon.loss.HuberLoss(rho=1.)
        # GluonCV trains only these (its train_patterns); the rest gets no gradient
        net.collect_params().setattr('grad_req', 'null')
        self.params = net.collect_train_params()
        self.params.setattr('grad_req', 'write')

    def batch(self, data):
        # batch 1 per device, as the script trains it: the first image only
        return [(b[0] if isinstance(b, (list, tuple)) else b).as_in_context(mx.cpu())
                for b in self.batchify([self.transform(*data[0])])]

    def forward(self, net, batch):
        x, label, rpn_cls_t, rpn_box_t, rpn_box_m = batch
        out = net(x, label[:, :, :4], label[:, :, 4:5])
        cls_pred, box_pred, rpn_score, rpn_box = out[0], out[1], out[5], out[6]
        cls_t, box_t, box_m = out[8], out[9], out[10]
        rpn_score = rpn_score.squeeze(axis=-1)
        n_rpn = (rpn_cls_t >= 0).sum()
        l_rpn_cls = self.rpn_cls(rpn_score, rpn_cls_t, rpn_cls_t >= 0) * rpn_cls_t.size / n_rpn
        l_rpn_box = self.rpn_box(rpn_box, rpn_box_t, rpn_box_m) * rpn_box.size / n_rpn
        n_rcnn = (cls_t >= 0).sum()
        l_rcnn_cls = self.rcnn_cls(cls_pred, cls_t, cls_t.expand_dims(-1) >= 0) * \
            cls_t.size / n_rcnn
        l_rcnn_box = self.rcnn_box(box_pred, box_t, box_m) * box_pred.size / n_rcnn
        loss = l_rpn_cls.sum() + l_rpn_box.sum() + l_rcnn_cls.sum() + l_rcnn_box.sum()
        return [loss], {'rpn_cls': total([l_rpn_cls]), 'rpn_box': total([l_rpn_box]),
                        'rcnn_cls': total([l_rcnn_cls]), 'rcnn_box': total([l_rcnn_box])}

    def val_input(self, data):
        from gluoncv.data.transforms.presets.rcnn import FasterRCNNDefaultValTransform
        t = FasterRCNNDefaultValTransform(self.short, self.max_size)
        return [t(*data[0])[0].expand_dims(0)]

    def set_nms(self, net):
        pass   # Faster-RCNN has no set_nms; the script only re-hybridizes


class CenterNet:
    name = 'center_net_resnet18_v1b_voc'
    size = 256

    def build(self):
        from gluoncv.model_zoo import get_model
        return get_model(self.name, pretrained=False, pretrained_base=False)

    def prepare(self, net, data):
        from gluoncv.data.transforms.presets.center_net import CenterNetDefaultTrainTransform
        import gluoncv as gcv
        self.transform = CenterNetDefaultTrainTransform(self.size, self.size,
                                                        num_class=NUM_CLASSES, scale_factor=4)
        self.heatmap = gcv.loss.HeatmapFocalLoss(from_logits=True)
        self.wh = gcv.loss.MaskedL1Loss(weight=0.1)
        self.center = gcv.loss.MaskedL1Loss(weight=1.0)

    def batch(self, data):
        return stack([self.transform(img, label) for img, label in data])

    def forward(self, net, batch):
        x, heat_t, wh_t, wh_m, center_t, center_m = batch
        heat, wh, center = net(x)
        losses = [self.heatmap(heat, heat_t), self.wh(wh, wh_t, wh_m),
                  self.center(center, center_t, center_m)]
        return [losses[0] + losses[1] + losses[2]], {
            'heatmap': total(losses[:1]), 'wh': total(losses[1:2]), 'center': total(losses[2:])}

    def val_input(self, data):
        from gluoncv.data.transforms.presets.center_net import CenterNetDefaultValTransform
        t = CenterNetDefaultValTransform(self.size, self.size)
        return [mx.nd.stack(*[t(img, label)[0] for img, label in data])]

    def set_nms(self, net):
        net.set_nms(nms_thresh=0.45, nms_topk=400, post_nms=100)


MODELS = {'ssd': SSD, 'ssd_mobilenet': SSDMobileNet, 'yolo3': YOLO3, 'faster_rcnn': FasterRCNN,
          'center_net': CenterNet}


# --- the executed graph --------------------------------------------------------------------------

def convolution_dtypes(net):
    """{dtype: count} of the Convolution outputs in the graph MXNet last built for ``net``
    (``net._cached_graph``: its inputs and the Symbol it runs, casts included)."""
    inputs, sym = net._cached_graph
    nodes = json.loads(sym.tojson(remove_amp_cast=False))['nodes']
    convs = {n['name'] + '_output' for n in nodes if n['op'] == 'Convolution'}
    internals = sym.get_internals()
    names = internals.list_outputs()
    _, out_types, _ = internals.infer_type_partial(**{i.name: 'float32' for i in inputs})
    counts = {}
    for name, t in zip(names, out_types):
        if name in convs:
            key = 'unknown' if t is None else \
                'bfloat16' if np.dtype(t) == BFLOAT16 else np.dtype(t).name
            counts[key] = counts.get(key, 0) + 1
    return {'counts': counts, 'total': len(convs),
            'casts': sum(n['op'] in ('amp_cast', 'amp_multicast') for n in nodes),
            'nodes': len(nodes)}


# --- one run -------------------------------------------------------------------------------------

def run(model, mode, seed, steps):
    import mxmp
    from mxmp import amp
    if mode == 'amp':
        amp.init(target_dtype='bfloat16')
    spec = MODELS[model]()
    lp = mxmp.lp_kernels_available('bfloat16')
    data = images(seed)

    net = spec.build()
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        net.initialize()
    original = net
    info = {}
    if mode == 'convert':
        net = mxmp.convert(net, 'bfloat16', emulate=not lp)
        info['same_object'] = net is original
        info['hybridized'] = bool(getattr(net, '_active', False))
        info['has_set_nms'] = hasattr(net, 'set_nms') == hasattr(type(original), 'set_nms')

    seed_all(seed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        spec.prepare(net, data)          # the transforms' own calls of the net
        batches = [spec.batch(data) for _ in range(steps)]
    # mxmp's notice that an imperative call under amp.init runs in float32
    info['imperative_warnings'] = sum('runs imperatively' in str(w.message) for w in caught)
    # Deferred initialization ran at the first call: Parameter by Parameter in call order when
    # that call was imperative, all at once in registration order when it built a graph (a
    # converted block), so the random values differ (float32 alone: 120% apart on SSD).
    # Initialize again, now that every shape is known, in one order for every mode.
    seed_all(seed)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        net.initialize(force_reinit=True)
    # the same inputs and targets in every mode (a check of the seeding)
    info['batch_sums'] = [float(sum(b.astype('float64').sum().asscalar() for b in batch))
                          for batch in batches]

    net.hybridize(**getattr(spec, 'hybridize', {}))
    params = getattr(spec, 'params', None) or net.collect_params()
    opt, opt_params = ('adam', {'learning_rate': 1e-4}) if model == 'center_net' else \
        ('sgd', {'learning_rate': 1e-3, 'momentum': 0.9, 'wd': 5e-4})
    if mode == 'convert':
        trainer = mxmp.Trainer(params, opt, opt_params)
    else:
        trainer = gluon.Trainer(params, opt, opt_params, update_on_kvstore=False)
        if mode == 'amp':
            amp.init_trainer(trainer)

    seed_all(seed)
    losses, times, cpu = [], [], []
    for batch in batches:
        t0, c0 = time.time(), time.process_time()
        with autograd.record():
            loss, parts = spec.forward(net, batch)
            if mode == 'amp':
                with amp.scale_loss(loss, trainer) as scaled:
                    autograd.backward(scaled)
            elif mode == 'convert':
                with trainer.scale_loss(loss) as scaled:
                    autograd.backward(scaled)
            else:
                autograd.backward(loss)
        trainer.step(batch[0].shape[0])
        mx.nd.waitall()
        times.append(time.time() - t0)
        cpu.append(time.process_time() - c0)   # not inflated by other jobs on the machine
        parts['total'] = sum(parts.values())
        losses.append(parts)
    info['train_graph'] = convolution_dtypes(net)
    info['graph_is_mxmp'] = mode != 'float32' and mxmp.converted_graph(net) is net._cached_graph[1]

    spec.set_nms(net)
    net.hybridize(**getattr(spec, 'hybridize', {}))
    outs = net(*spec.val_input(data))
    outs = outs if isinstance(outs, (list, tuple)) else [outs]
    mx.nd.waitall()
    info['val_graph'] = convolution_dtypes(net)
    info['val'] = [{'shape': list(o.shape), 'dtype': np.dtype(o.dtype).name,
                    'finite': bool(np.isfinite(o.asnumpy()).all())} for o in outs]
    info.update(model=spec.name, mode=mode, seed=seed, lp_kernels=lp, losses=losses,
                step_seconds=times, step_cpu_seconds=cpu,
                s_per_step=statistics.median(times[1:]) if len(times) > 1 else times[0],
                mxmp=os.path.dirname(mxmp.__file__))
    return info


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('model', choices=sorted(MODELS))
    p.add_argument('mode', choices=('float32', 'convert', 'amp'))
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--steps', type=int, default=3)
    a = p.parse_args(argv)
    print(json.dumps(run(a.model, a.mode, a.seed, a.steps)))


if __name__ == '__main__':
    main()
