"""What the graph pass decides for each node, and why: :func:`explain` and its renderings.

:func:`explain` runs the plan of :func:`mxmp.convert_symbol` without rewriting the graph;
:func:`format_explain` and :func:`format_explain_table` render its rows (the latter is what
``mxmp explain`` prints).
"""
import collections

from .plan import plan, prepare

__all__ = ['ExplainRow', 'explain', 'format_explain', 'format_explain_table']

ExplainRow = collections.namedtuple('ExplainRow', ['name', 'op', 'dtype', 'rule'])
ExplainRow.__doc__ = """One decision of the pass: node ``name`` of operator ``op`` computes in
``dtype`` (``None`` for a node without float outputs) because of ``rule``."""


def explain(sym, target_dtype=None, policy=None, data_dtypes=None, cast_params=False,
            data_names=None):
    """List the pass's decision for every node of ``sym``.

    Args: as :func:`mxmp.convert_symbol` (``sym`` may be float32 or already converted; casts are
        ignored).

    Returns:
        list of :class:`ExplainRow` ``(name, op, dtype, rule)``, one per node in topological
        order; variables have op ``'null'``. ``format_explain(rows)`` prints them as a table.
    """
    js, policy, input_dtypes, names, pinned = prepare(sym, target_dtype, policy, None,
                                                      data_dtypes, data_names)
    decisions, _ = plan(js, policy, input_dtypes, cast_params, names, pinned)
    return [ExplainRow(node['name'], node['op'], dec.dtype, dec.rule)
            for node, dec in zip(js['nodes'], decisions)]


def format_explain(rows, include_variables=False):
    """Render :func:`explain` rows, one line each: ``FullyConnected fc1 -> float16: rule``."""
    lines = []
    for row in rows:
        if row.op == 'null' and not include_variables:
            continue
        lines.append('%s %s -> %s: %s' % (row.op if row.op != 'null' else 'variable', row.name,
                                         row.dtype, row.rule))
    return '\n'.join(lines)


def format_explain_table(rows):
    """Render :func:`explain` rows as an aligned table (node, op, dtype, rule) followed by a
    summary line counting the nodes per dtype; variables count in the table only.

    Args:
        rows (list of ExplainRow): as :func:`explain` returns them (filtered or not).

    Returns:
        str: the lines, joined by newlines (no trailing newline).
    """
    table = [('node', 'op', 'dtype', 'rule')] + [
        (r.name, r.op if r.op != 'null' else 'variable', r.dtype or '-', r.rule) for r in rows]
    widths = [max(len(t[i]) for t in table) for i in range(3)]
    lines = []
    for k, line in enumerate(table):
        lines.append('  '.join(c.ljust(w) for c, w in zip(line[:3], widths)) + '  ' + line[3])
        if k == 0:
            lines.append('  '.join('-' * w for w in widths) + '  ' + '-' * 4)
    counts = {}
    for r in rows:
        if r.op != 'null':
            counts[r.dtype] = counts.get(r.dtype, 0) + 1
    lines.append('%d node(s): %s' % (sum(counts.values()), ', '.join(
        '%d in %s' % (n, d or 'no float dtype') for d, n in sorted(counts.items(),
                                                                    key=lambda kv: str(kv[0])))))
    return '\n'.join(lines)
