"""The uncapped dense engine: an exact 0/1 knapsack in O(W) memory, for calls without prefix capacities.

- ``solve.py``: the entry (``solve_uncapped``): exact reductions, then Hirschberg on the core, in one
  process or on worker processes (``runtime.pool``);
- ``reduce.py``: the exact reductions (LP fixing, bundles of identical items, common divisor);
- ``hirschberg.py``: Hirschberg's divide and conquer (balanced halves, checkpoints, levels of tasks);
- ``profile.py``: the value profile and the leaves' bit tables, on the kernels below;
- ``_kernels_numpy.py``, ``_kernels_numba.py``: bit-identical twins (``runtime.backend`` picks one).
"""
