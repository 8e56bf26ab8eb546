"""The mixed-precision graph pass over an MXNet Symbol (re-exports only).

Where things are:

* :mod:`mxmp._src.graph.symbol_json`: load/dump a Symbol's JSON, the attributes mxmp writes
  (``MARK``, ``ROUND_MARK``, ``PINNED``), :func:`is_cast_param`/:func:`cast_param_names`,
  :func:`cast_origin` (who wrote a cast) and :func:`pin_variable_dtypes`;
* :mod:`mxmp._src.graph.infer`: MXNet's dtype inference on a graph JSON, by node position;
* :mod:`mxmp._src.graph.plan`: the dtype each node computes in, and the rule that chose it;
* :mod:`mxmp._src.graph.convert`: :func:`convert_symbol`, the pass (its docstring describes it);
* :mod:`mxmp._src.graph.explain`: :func:`explain`, :func:`format_explain`, :class:`ExplainRow`;
* :mod:`mxmp._src.graph.strip`: :func:`remove_casts`, :func:`count_casts`, :func:`cast_origins`,
  :func:`converted_dtype`;
* :mod:`mxmp._src.graph.params`: the parameter arrays that go with a converted or stripped graph.
"""
