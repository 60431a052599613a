"""What the engines run on: the kernels' back end, the stop flag, and the worker processes.

- ``backend.py``: numba or numpy, one choice for every engine's kernels (``KERNEL``);
- ``interrupt.py``: the stop flag the kernels poll, and the helper thread that lets Ctrl-C through;
- ``pool.py``: executors of a level's tasks, in this process or on workers sharing a memfd arena;
- ``workers.py``: the worker processes (started on demand, killed on any failure, exit with parent).

Nothing here imports an engine (``dense``, ``capped``): tasks bring their own ``run``.
"""
