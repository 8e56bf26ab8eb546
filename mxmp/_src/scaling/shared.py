"""One loss scale shared by several :class:`mxmp.Trainer` objects, as PyTorch's GradScaler.

PyTorch trains several optimizers (a GAN's generator and discriminator, an encoder and a
decoder with their own learning rates) with one ``GradScaler``: ``scaler.step(opt)`` per
optimizer, then one ``scaler.update()`` per iteration. ``torch/amp/grad_scaler.py`` defines
what that means: ``step(opt)`` unscales and checks *that optimizer's* gradients and skips
*that optimizer's* ``step`` if they hold inf/NaN; ``update()`` looks at the inf/NaN findings of
every optimizer stepped since the last update and changes the scale once (backs off once if any
overflowed, else counts one finite iteration towards growth).

mxmp does the same without a separate ``update`` call. Pass one :class:`~mxmp.LossScaler`
*object* to several Trainers and they share it::

    scaler = mxmp.DynamicLossScaler()
    trainer_g = mxmp.Trainer(gen.collect_params(), 'adam', ..., loss_scaler=scaler)
    trainer_d = mxmp.Trainer(disc.collect_params(), 'adam', ..., loss_scaler=scaler)

* every Trainer of the group scales with the same loss scale (``trainer.loss_scale``);
* each Trainer checks its own gradients (each gradient is checked once per iteration) and
  skips its own update if they overflowed, as PyTorch skips that optimizer's step; the other
  Trainers' updates are applied;
* the scale changes once per iteration, when every Trainer of the group has stepped since the
  last change: it backs off once if any of them overflowed (the scaler's ``adjust(False)``),
  otherwise it counts one finite iteration (``adjust(True)``). It never changes between two
  Trainers' steps, so the gradients a Trainer unscales were scaled with the scale it divides by;
* a Trainer that steps again before every other Trainer of the group has stepped raises
  ``RuntimeError`` naming the ones that have not: an iteration is one step of each. Trainers
  that step at different rates (e.g. five critic steps per generator step) need their own
  scalers. A Trainer leaves the group when it is garbage collected (gluon's Parameters keep a
  reference to their latest Trainer, so that is when a new Trainer takes its Parameters or they
  are deleted); a
  Trainer created when no other Trainer of the group is alive starts from the scaler's own
  value again (reusing one scaler object for runs one after another does not carry the scale
  over).

Trainers given *different* scaler objects (or a specification such as ``'dynamic'``) keep their
own scale, as before. Sharing is by object identity: two ``DynamicLossScaler()`` that compare
equal are still two scalers. The scaler objects themselves stay immutable values: the live
scale is ``trainer.loss_scale`` / ``trainer.loss_scaler`` of any Trainer of the group.
"""
import weakref

__all__ = ['ScaleGroup', 'group_for']


class ScaleGroup:
    """The current loss scaler of one or more Trainers and the bookkeeping of one iteration.

    Args:
        scaler (mxmp.LossScaler): the starting scaler.

    Attributes:
        current (mxmp.LossScaler): the scaler every member uses now.
    """

    def __init__(self, scaler):
        self.current = scaler
        self._members = []          # weakrefs, in joining order
        self._stepped = set()       # ids of members that stepped in this iteration
        self._finite = True         # no member overflowed in this iteration

    def join(self, trainer):
        """Add ``trainer`` (held through a weak reference)."""
        self._members.append(weakref.ref(trainer, self._forget))
        return self

    def _forget(self, ref):
        self._members = [m for m in self._members if m is not ref]

    def _live(self):
        return [t for t in (m() for m in self._members) if t is not None]

    @property
    def size(self):
        """int: number of live Trainers sharing this scaler."""
        return len(self._live())

    def check_can_step(self, trainer):
        """Raise RuntimeError if ``trainer`` already stepped in this iteration of the group."""
        if id(trainer) not in self._stepped:
            return
        waiting = [t for t in self._live() if id(t) not in self._stepped]
        raise RuntimeError(
            'this Trainer shares its loss scaler with %d other Trainer(s) and has already '
            'stepped in this iteration, while %d of them have not (%s). The shared scale '
            'changes once per iteration, after every Trainer that shares it has stepped once '
            '(as PyTorch: scaler.step(opt) for each optimizer, then one scaler.update()). Step '
            'every Trainer once per iteration, or give Trainers that step at different rates '
            'their own loss scaler objects (mxmp.DynamicLossScaler() each). A Trainer of an '
            'earlier run stays in the group while its Parameters exist (gluon keeps a reference '
            'to it in each Parameter): give every run its own scaler object.'
            % (self.size - 1, len(waiting), ', '.join(_describe(t) for t in waiting)))

    def stepped(self, trainer, finite):
        """Record that ``trainer`` stepped (``finite``: its gradients had no inf/NaN).

        When every live member has stepped, the scaler is adjusted once with whether all of
        them were finite, and a new iteration begins.

        Returns:
            bool: whether the scale was updated by this call.
        """
        self._stepped.add(id(trainer))
        self._finite = self._finite and bool(finite)
        if any(id(t) not in self._stepped for t in self._live()):
            return False
        self.current = self.current.adjust(self._finite)
        self._stepped, self._finite = set(), True
        return True


def _describe(trainer):
    params = getattr(trainer, '_params', [])
    first = params[0].name if params else 'no parameters'
    return 'Trainer of %d parameter(s) starting with %s' % (len(params), first)


# scaler object id -> (weakref to the scaler, group); sharing is by identity (frozen dataclasses
# compare and hash by value, so they cannot be dict keys here)
_GROUPS = {}


def group_for(scaler, trainer, shared):
    """The :class:`ScaleGroup` ``trainer`` joins.

    Args:
        scaler (mxmp.LossScaler): the Trainer's starting scaler.
        trainer (mxmp.Trainer): the new member.
        shared (bool): True if ``scaler`` is the object the user passed (Trainers passed the
            same object share one group); False for a scaler made from a specification (a
            group of its own).
    """
    if not shared:
        return ScaleGroup(scaler).join(trainer)
    key = id(scaler)
    entry = _GROUPS.get(key)
    if entry is None or entry[0]() is not scaler or entry[1].size == 0:
        # a group whose Trainers are all gone starts afresh from the scaler's own value
        entry = (weakref.ref(scaler, lambda _, k=key, groups=_GROUPS: groups.pop(k, None)),
                 ScaleGroup(scaler))
        _GROUPS[key] = entry
    return entry[1].join(trainer)
