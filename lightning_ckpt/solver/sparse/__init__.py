"""The exact sparse layer of the one engine: reductions and Pareto lists of (weight, value) pruned by
dominance and bounds (imports nothing else of the package).

- ``pareto.py``: one DP step on a sorted state list (merge, dominance), and the walk back to a set;
- ``reduce.py``: the exact reductions (LP fixing, bundles of identical items, common divisor);
  ``reduce_lists.py``: the same on Python lists, for instances of at most 64 items;
- ``minknap.py``: an expanding core around the break item in the style of Pisinger's ``minknap``,
  for a run where no cap binds (``capped/run.py`` falls back to Hirschberg past a state bound);
- ``bounds.py``: ``combo``'s strong bounds for the hard instances (the cardinality-constrained upper
  bound, the best swap from the break solution, the pairing of states with one outside item).
"""
