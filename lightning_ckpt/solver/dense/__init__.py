"""The dense pass without caps: an exact 0/1 knapsack in O(W) memory, the one engine's fallback on runs
where no cap binds (``capped/run.py``; every call of ``solve_knapsack`` without caps is one).

- ``solve.py``: ``solve_core``: Hirschberg on a reduced instance, in one process or on worker
  processes (``runtime.pool``);
- ``hirschberg.py``: Hirschberg's divide and conquer (balanced halves, checkpoints, levels of tasks);
- ``profile.py``: the value profile and the leaves' bit tables, on the kernels below;
- ``_kernels_numpy.py``, ``_kernels_numba.py``: bit-identical twins (``runtime.backend`` picks one).
"""
