"""The one engine: an exact knapsack with prefix capacities (the form of a plan's peak constraints), and
without them (its case of no caps).

- ``solve.py``: the entry (``solve_capped``): without binding caps one run core-first (``run.py``);
  else common divisor, the sparse frontier first (``"auto"``), the dense capped Hirschberg past
  ``SPARSE_MAX_ENTRIES`` entries or for ``"hirschberg"``;
- ``run.py``: a run of 0/1 items where no cap binds: the exact reductions and minknap's expanding
  core (``sparse/``), the dense pass without caps (``dense/``) past its state budget;
- ``frontier.py``: the sparse Pareto-frontier DP (chain caps, reduced-value fixing, falling targets);
- ``chain_bound.py``: the chain of prefix caps and its LP dual (bounds for the frontier);
- ``hirschberg.py``: the dense capped Hirschberg, O(W) memory whatever the frontier would hold;
- ``profile.py``: its forward and backward capped profiles and leaves (numpy), and
  ``_kernels_numba.py``, their compiled twins (``runtime.backend`` picks).
"""
