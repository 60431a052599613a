"""What the engines run on: the kernels' back end, the stop flag, and the worker processes.

- ``backend.py``: numba or numpy, one choice for every engine's kernels (``KERNEL``);
- ``jit.py``: the kernels' numba decorator, cached on disk where numba can write, else in memory;
- ``interrupt.py``: the stop flag the kernels poll, and the helper thread that lets Ctrl-C through;
- ``pool.py``: executors of a level's tasks, in this process or on workers sharing a memfd arena;
- ``cpus.py``: whether the CPUs have room for the workers now (a busy machine solves in one process);
- ``guard.py``: the watch that ends a parallel solve at once on a dead, stopped or hung worker;
- ``workers.py``: the worker processes (started on demand, killed on any failure, exit with parent);
- ``limits.py``: the room left under ``ulimit -v``/``-d``, for the memory checks of ``fits.py``.

Nothing here imports an engine (``dense``, ``capped``): tasks bring their own ``run``.
"""
