"""The capped engine: an exact knapsack with prefix capacities (the form of a plan's peak constraints).

- ``solve.py``: the entry (``solve_capped``): common divisor, the sparse frontier first (``"auto"``),
  the dense capped Hirschberg past ``SPARSE_MAX_ENTRIES`` entries or for ``"hirschberg"``;
- ``frontier.py``: the sparse Pareto-frontier DP (chain caps, reduced-value fixing, falling targets);
- ``chain_bound.py``: the chain of prefix caps and its LP dual (bounds for the frontier);
- ``hirschberg.py``: the dense capped Hirschberg, O(W) memory whatever the frontier would hold;
- ``profile.py``: its forward and backward capped profiles and leaves (numpy), and
  ``_kernels_numba.py``, their compiled twins (``runtime.backend`` picks).
"""
