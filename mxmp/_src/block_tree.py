"""The HybridBlocks inside a plain ``gluon.Block`` (Python ``forward``, such as GluonNLP's
``NMTModel``): what :func:`mxmp.convert` converts when it is given such a Block."""
import logging

from mxnet import gluon

__all__ = ['hybrid_parts', 'hybrid_parts_to_convert', 'refuse_second_policy']


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


def refuse_second_policy(block, conversion, converted):
    """Raise if :func:`mxmp.convert` converted ``block`` or a HybridBlock inside it with settings
    other than ``conversion``: one graph runs one policy, so converting a parent would silently
    replace the policy the user gave one of its children.

    Args:
        block (mxnet.gluon.HybridBlock): the block being converted.
        conversion: the settings it is being converted with (compared with ``==``).
        converted (mapping): HybridBlock -> the settings it was converted with.

    Raises:
        ValueError: naming the block converted otherwise, its target dtype and the fix.
    """
    queue = [block]   # breadth first: the outermost block converted otherwise is named
    for b in queue:
        if isinstance(b, gluon.HybridBlock) and converted.get(b, conversion) != conversion:
            raise ValueError(
                '%s is already converted by mxmp (target dtype %s); converting %s with other '
                'settings would mix two policies in one graph. Build the network anew (or load '
                'its float32 checkpoint into a new one) and convert it once, with one Policy '
                '(its op lists choose per op).'
                % (b.name, converted[b].policy.target_dtype, block.name))
        queue.extend(b._children.values())
