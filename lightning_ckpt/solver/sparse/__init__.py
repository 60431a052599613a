"""Sparse states shared by the engines: Pareto lists of (weight, value) pruned by dominance and bounds.

- ``pareto.py``: one DP step on a sorted state list (merge, dominance), and the walk back to a set;
- ``minknap.py``: the uncapped engine's first try, an expanding core around the break item in the
  style of Pisinger's ``minknap`` (``dense/solve.py`` falls back to Hirschberg past a state bound).
- ``bounds.py``: ``combo``'s strong bounds for the hard instances (the cardinality-constrained upper
  bound, the best swap from the break solution, the pairing of states with one outside item).
"""
