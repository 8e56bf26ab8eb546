"""The HybridBlocks inside a plain ``gluon.Block`` (Python ``forward``, such as GluonNLP's
``NMTModel``): what :func:`mxmp.convert` converts when it is given such a Block."""
import logging

from mxnet import gluon

__all__ = ['hybrid_parts', 'hybrid_parts_to_convert']


def hybrid_parts(block):
    """The outermost HybridBlocks inside ``block``, each once, in the order of its children.

    Args:
        block (mxnet.gluon.Block): any Block.

    Returns:
        list of mxnet.gluon.HybridBlock: empty when ``block`` holds none (then nothing in it
        can run as a graph).
    """
    parts, seen = [], set()

    def walk(b):
        for child in b._children.values():
            if id(child) not in seen:   # id(): a set local to this call (a shared child)
                seen.add(id(child))   # id(): as above
                if isinstance(child, gluon.HybridBlock):
                    parts.append(child)
                else:
                    walk(child)
    walk(block)
    return parts


def hybrid_parts_to_convert(block):
    """:func:`hybrid_parts` of ``block`` for :func:`mxmp.convert` (logged).

    Raises:
        TypeError: ``block`` is not a gluon.Block, or holds no HybridBlock (the fix named).
    """
    parts = hybrid_parts(block) if isinstance(block, gluon.Block) else []
    if not parts:
        raise TypeError('mxmp.convert needs a gluon.HybridBlock (or a Block holding some), got '
                        '%s with none inside: write it as a HybridBlock with '
                        'hybrid_forward(self, F, x)' % type(block).__name__)
    logging.getLogger('mxmp.gluon').info(
        'mxmp.convert: %s is a plain Block; converting its HybridBlocks %s (its own forward '
        'runs as written)', block.name, [p.name for p in parts])
    return parts
