"""The HybridBlocks inside a plain ``gluon.Block`` (Python ``forward``, such as GluonNLP's
``NMTModel``): what :func:`mxmp.convert` converts when it is given such a Block."""
from mxnet import gluon

__all__ = ['hybrid_parts']


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
