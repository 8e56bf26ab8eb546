"""Loss scaling: the loss scalers (pure values) and the overflow check of gradients.

The public names are re-exported by :mod:`mxmp`.
"""
