"""The solver's runtime where the machine is unfriendly: no writable numba cache, a broken numba,
a worker that hangs or is stopped,
an address-space limit, Ctrl-C on Python 3.11, busy CPUs.

Each numba case runs in a subprocess on a copy of the package, so this process's loaded kernels
and caches are untouched.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from lightning_ckpt.solver import SolverOptions, solve_knapsack
from lightning_ckpt.solver.runtime import backend, cpus, guard

PACKAGE = Path(__file__).resolve().parents[1] / "lightning_ckpt"
ANSWERS = """
import numpy as np
from lightning_ckpt.solver import solve_knapsack

def answers():
    rng = np.random.default_rng(0)
    w = rng.integers(1, 100, 60)
    v = w * rng.uniform(0.9, 1.1, 60)
    plain = solve_knapsack(w, v, 1500, method="hirschberg")
    capped = solve_knapsack(w, v, 1500, method="hirschberg", prefix_capacities=1500 - w)
    return f"{plain.value} {plain.chosen} {capped.value} {capped.chosen}"
"""
PROBE = f"""
import warnings
warnings.simplefilter("always")
from lightning_ckpt.solver.runtime import backend
backend.load_numba()  # every kernel from numba, however small the solve
{ANSWERS}
print(answers(), "|", [m is not None for m in backend._LOADED.values()])
"""

numba_only = pytest.mark.skipif(backend.KERNEL != "numba", reason="numba is not installed or is off")


def _read_only_install(root: Path) -> Path:
    """A copy of the package under ``root`` that nobody can write to, root included: every
    ``__pycache__`` is a regular file (so mkdir fails even where chmod does not stop root)."""
    shutil.copytree(PACKAGE, root / "lightning_ckpt", ignore=shutil.ignore_patterns("__pycache__"))
    for folder in [root / "lightning_ckpt", *(root / "lightning_ckpt").rglob("*")]:
        if folder.is_dir():
            (folder / "__pycache__").write_text("not a directory")
    (root / "home").write_text("not a directory either")  # HOME and XDG_CACHE_HOME under a file
    for path in [root, *root.rglob("*")]:
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    return root


def _writable_again(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)


def _probe(root: Path, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "LIGHTNING_CKPT_NO_NUMBA")}
    base |= {
        "PYTHONPATH": str(root),
        "HOME": str(root / "home" / "h"),
        "XDG_CACHE_HOME": str(root / "home" / "c"),
    }
    return subprocess.run(
        [sys.executable, "-c", PROBE], env=base | env, cwd=root, capture_output=True, text=True, timeout=120
    )


def _reference() -> str:
    """The probe's answers computed here (numpy and numba kernels give the same bits)."""
    namespace: dict = {}
    exec(ANSWERS, namespace)
    return namespace["answers"]()


@numba_only
@pytest.mark.parametrize(
    "cache_dir", [None, "unwritable"], ids=["no-cache-dir", "unwritable-NUMBA_CACHE_DIR"]
)
def test_a_read_only_install_and_home_compile_in_memory_with_one_warning(tmp_path, cache_dir):
    root = _read_only_install(tmp_path)
    try:
        env = {} if cache_dir is None else {"NUMBA_CACHE_DIR": str(root / "home" / "numba")}
        done = _probe(root, **env)
    finally:
        _writable_again(root)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("| [True, True]")  # numba ran, from memory
    assert done.stdout.split(" | ")[0] == _reference()
    assert done.stderr.count("RuntimeWarning") == 1, done.stderr
    assert "numba cannot cache the knapsack solver's compiled kernels" in done.stderr
    assert "Set NUMBA_CACHE_DIR to a writable directory" in done.stderr


@numba_only
def test_a_writable_NUMBA_CACHE_DIR_is_used_by_a_read_only_install(tmp_path):
    root = _read_only_install(tmp_path / "install")
    cache = tmp_path / "cache"
    try:
        done = _probe(root, NUMBA_CACHE_DIR=str(cache))
    finally:
        _writable_again(root)
    assert done.returncode == 0, done.stderr
    assert "RuntimeWarning" not in done.stderr, done.stderr
    assert done.stdout.strip().endswith("| [True, True]")
    assert {p.suffix for p in cache.rglob("*")} >= {".nbi", ".nbc"}  # the kernels were cached there


def test_a_kernel_module_that_fails_to_load_falls_back_to_numpy_with_one_warning(monkeypatch):
    if backend.KERNEL != "numba":
        monkeypatch.setattr(backend, "KERNEL", "numba")
    monkeypatch.setattr(backend, "_LOADED", {})

    def broken(name):
        raise RuntimeError("cannot cache function '_apply': no locator available")

    monkeypatch.setattr(backend.importlib, "import_module", broken)
    with pytest.warns(
        RuntimeWarning, match=r"numba kernels cannot be loaded \(RuntimeError: cannot cache"
    ) as caught:
        backend.load_numba()
        assert backend.compiled(1 << 30, backend.DENSE_NUMBA) is None
        assert backend.compiled(1 << 30, backend.CAPPED_NUMBA) is None
    assert len(caught) == 1


def test_numba_loads_once_the_numpy_work_would_pass_its_load_cost(monkeypatch):
    """The ski-rental rule: numpy while its estimated seconds so far, the call at hand included,
    stay under ``NUMBA_LOAD_S``; numba for every engine from the call that passes it."""
    pytest.importorskip("numba")
    monkeypatch.setattr(backend, "KERNEL", "numba")
    monkeypatch.setattr(backend, "_LOADED", {})
    monkeypatch.setattr(backend, "_NUMPY_S", [0.0])
    cells = int(0.45 * backend.NUMBA_LOAD_S / backend.NUMPY_S_PER_CELL[backend.DENSE_NUMBA])
    assert backend.compiled(cells, backend.DENSE_NUMBA) is None  # 0.45 of the load cost
    assert backend.compiled(cells, backend.DENSE_NUMBA) is None  # 0.9
    assert backend.compiled(cells, backend.DENSE_NUMBA) is not None  # 1.35: numba pays from here
    assert backend.compiled(1, backend.CAPPED_NUMBA) is not None  # and stays, small calls too


def test_small_numpy_passes_count_their_items_toward_numbas_load(monkeypatch):
    """A small leaf's numpy cost is mostly per item (its numpy calls), not per cell: both count, so
    that a process making thousands of compile-sized solves loads numba too."""
    from lightning_ckpt.solver.dense.profile import NUMPY_CELLS_PER_ITEM, solve_leaf

    monkeypatch.setattr(backend, "KERNEL", "numba")
    monkeypatch.setattr(backend, "_LOADED", {})
    monkeypatch.setattr(backend, "_NUMPY_S", [0.0])
    chosen = solve_leaf(np.array([1, 2, 3]), np.array([1.0, 1.0, 1.5]), 4, np.empty(5))
    assert chosen.tolist() == [True, False, True] and not backend._LOADED  # numpy answered
    expected_s = (3 * 5 + 3 * NUMPY_CELLS_PER_ITEM) * backend.NUMPY_S_PER_CELL[backend.DENSE_NUMBA]
    assert backend._NUMPY_S[0] == pytest.approx(expected_s)


def test_a_mid_sized_solve_in_a_fresh_process_stays_in_numpy():
    """n = 200, W = 1e5 (2.3e7 cells, ~30 ms in numpy) does not pay numba's ~1.2 s load."""
    from tests.test_solver_api import _run_python

    code = (
        "import sys, numpy as np; from lightning_ckpt.solver import solve_knapsack; "
        "rng = np.random.default_rng(1); w = rng.integers(1000, 10_000, 200); "
        "r = solve_knapsack(w, w * rng.uniform(0.9, 1.1, 200), 100_000, method='hirschberg'); "
        "print(r.stats.cell_updates > 10_000_000, 'numba' in sys.modules)"
    )
    assert _run_python(code) == "True False"


class _Sleeper:
    """A stand-in worker: a live process that never answers (``guard`` reads ``proc`` and
    ``fault`` and calls ``kill``)."""

    fault = None

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    def kill(self) -> None:
        self.proc.kill()


@pytest.mark.parametrize("fault", ["hung", "stopped"])
def test_the_guard_gives_up_a_hung_or_stopped_worker_and_stops_the_solve(monkeypatch, fault):
    monkeypatch.setattr(guard, "DEADLINE_FLOOR_S", 0.3)
    monkeypatch.setattr(guard, "STOPPED_GRACE_S", 0.3)
    worker, stop = _Sleeper(), np.zeros(1, dtype=np.uint8)
    watch = guard.WorkerGuard([worker], stop)
    try:
        if fault == "hung":
            watch.expect(worker, cells=0)
        else:
            os.kill(worker.proc.pid, signal.SIGSTOP)
        worker.proc.wait(timeout=10)  # the guard kills it
    finally:
        watch.close()
        worker.kill()
    assert watch.fault is worker and stop[0] == 1
    expected = "did not answer within its deadline" if fault == "hung" else "was stopped (SIGSTOP"
    assert worker.fault.startswith(expected), worker.fault


def test_the_guard_leaves_a_worker_that_answers_in_time_alone(monkeypatch):
    monkeypatch.setattr(guard, "DEADLINE_FLOOR_S", 0.2)
    worker, stop = _Sleeper(), np.zeros(1, dtype=np.uint8)
    watch = guard.WorkerGuard([worker], stop)
    try:
        watch.expect(worker, cells=10**12)  # a big task: a deadline far beyond the floor
        time.sleep(0.5)
        alive = worker.proc.poll() is None
    finally:
        watch.close()
        worker.kill()
    assert alive and watch.fault is None and stop[0] == 0


INTERRUPTED_SOLVE = """
import os, signal, threading, time
from lightning_ckpt.solver.runtime import interrupt
finished = []
def work(stop):
    while not stop[0]:
        time.sleep(0.01)
    time.sleep(0.3)  # the stopped kernel finishes its item
    finished.append(True)
stop = interrupt.new_stop_flag()
for delay_s in (0.2, 0.35):  # Ctrl-C, and again while the helper finishes
    threading.Timer(delay_s, os.kill, (os.getpid(), signal.SIGINT)).start()
try:
    interrupt.run_interruptibly(lambda: work(stop), stop)
except KeyboardInterrupt:
    print("interrupted", "after the helper" if finished else "before the helper finished")
"""


def test_ctrl_c_leaves_only_after_the_helper_thread_has_finished():
    """On Python 3.11 a ``Thread.join`` interrupted by Ctrl-C marks the running thread as ended, so the
    interrupt used to leave while the solve still ran (and held its arena and workers)."""
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_SOLVE], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "interrupted after the helper"


UNDER_ULIMIT = """
import resource, time
import numpy as np
from lightning_ckpt.solver import solve_knapsack
from lightning_ckpt.solver.runtime.limits import _mapped_bytes, mappable_bytes
limit = _mapped_bytes()["VmSize"] + 2**30  # ulimit -v: 1 GiB more than is mapped now
resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
assert 0 < mappable_bytes() <= 2**30, mappable_bytes()
rng = np.random.default_rng(6)
capacity = 140_000_000  # the paper's W: two profiles of 1.1 GB each
weights = rng.integers(capacity // 200, capacity // 20, 300)
values = weights * rng.uniform(0.9, 1.1, 300)
started = time.monotonic()
try:
    solve_knapsack(weights, values, capacity, method="hirschberg", prefix_capacities=capacity - weights)
except MemoryError as exc:
    print(f"{time.monotonic() - started:.2f}", exc)
"""


def test_a_capped_solve_under_ulimit_v_refuses_up_front_with_the_librarys_advice():
    done = subprocess.run([sys.executable, "-c", UNDER_ULIMIT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seconds, message = done.stdout.split(" ", 1)
    assert message.startswith("the capped O(W) solver's profiles (capacity 140000000) needs 4.17 GiB"), (
        message
    )
    assert "(the room left under this process's `ulimit -v`/`-d`)" in message
    assert "a larger `quantum_bytes`" in message and message.strip().endswith("or raise the limit")
    assert float(seconds) < 5.0  # before any pass over the items (numpy's own MemoryError came after them)


def _cpus_busy(monkeypatch, runnable_threads: int) -> None:
    """This machine seen as 2 CPUs with ``runnable_threads`` threads runnable (the looker among them)."""
    monkeypatch.setattr(cpus, "usable_cpus", lambda: 2)
    monkeypatch.setattr(cpus.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(cpus, "_runnable_threads", lambda: runnable_threads)


@pytest.mark.parametrize(("runnable", "idle", "room"), [(1, 2.0, True), (2, 1.0, False), (9, 0.0, False)])
def test_idle_cpus_count_the_run_queue_beside_the_looker(monkeypatch, runnable, idle, room):
    _cpus_busy(monkeypatch, runnable)
    assert cpus.idle_cpus() == idle and cpus.room_for(2) is room and cpus.room_for(1)


# (requested, cells, runnable threads, processes): sizes from the idle 2-CPU table of
# ``SolverOptions.parallel_min_solve_cells`` (two processes lost at 4e8 cells, won from 5.6e8)
_DECISIONS = [
    (1, 10**10, 1, 1),  # one asked for: one
    (2, 2 * 10**8, 1, 1),  # idle, but small: 0.55-0.59x measured
    (2, 4 * 10**8, 1, 1),  # idle, 0.89x measured
    (2, 5_600 * 10**5, 1, 2),  # idle, 1.11x measured
    (2, 10**9, 1, 2),
    (2, 10**9, 2, 1),  # one other runnable thread: no idle CPU for the second process
    (2, 10**9, 9, 1),  # busy (0.28-0.73x measured at load 15)
]


@pytest.mark.parametrize(("requested", "cells", "runnable", "processes"), _DECISIONS)
def test_processes_for_decides_from_the_size_then_the_idle_cpus(
    monkeypatch, requested, cells, runnable, processes
):
    _cpus_busy(monkeypatch, runnable)
    min_cells = SolverOptions().parallel_min_solve_cells
    assert cpus.processes_for(requested, cells, min_cells) == processes


def test_processes_for_forced_ignores_size_and_load_and_looks_only_when_large(monkeypatch):
    _cpus_busy(monkeypatch, 9)
    assert cpus.processes_for(2, 1, 0) == 2 and cpus.processes_for(1, 1, 0) == 1
    looks = []
    monkeypatch.setattr(cpus, "_runnable_threads", lambda: looks.append(1) or 1)
    assert cpus.processes_for(2, (1 << 29) - 1, 1 << 29) == 1 and not looks  # too small: no look
    assert cpus.processes_for(2, 1 << 29, 1 << 29) == 2 and looks


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 usable CPUs for workers=2")
@pytest.mark.parametrize(("runnable", "min_cells", "used"), [(1, 1, 2), (9, 1, 1), (9, 0, 2)])
def test_a_parallel_solve_runs_in_one_process_when_the_cpus_are_busy(monkeypatch, runnable, min_cells, used):
    """Busy CPUs: one process (a second one only competes); ``parallel_min_solve_cells=0`` forces
    the workers. The answer is the same either way."""
    _cpus_busy(monkeypatch, runnable)
    rng = np.random.default_rng(5)
    weights = rng.integers(1, 300, 80)
    values = weights * rng.uniform(0.9, 1.1, 80)
    options = SolverOptions(
        parallel_min_solve_cells=min_cells, parallel_min_task_cells=0, sparse_max_states=0
    )
    result = solve_knapsack(weights, values, 4_000, workers=2, options=options)
    assert result.stats.workers_used == used and result.stats.path == "hirschberg"
    assert result == solve_knapsack(weights, values, 4_000)


FORKED = """
import os
import numpy as np
from lightning_ckpt.solver import SolverOptions, solve_knapsack
from lightning_ckpt.solver.runtime import workers
eager = SolverOptions(parallel_min_solve_cells=0, parallel_min_task_cells=0, leaf_max_cells=0, sparse_max_states=0)
rng = np.random.default_rng(3)
w = rng.integers(1, 300, 80)
v = w * rng.uniform(0.9, 1.1, 80)
alone = solve_knapsack(w, v, 4000)
solve_knapsack(w, v, 4000, workers=2, options=eager)  # the parent's pool is up
parents = workers.live_worker_pids()
child = os.fork()
if child == 0:
    mine = solve_knapsack(w, v, 4000, workers=2, options=eager)
    ok = mine == alone and mine.stats.workers_used == 2 and not set(parents) & set(workers.live_worker_pids())
    workers.shutdown_workers()
    os._exit(0 if ok else 1)
_, status = os.waitpid(child, 0)
again = solve_knapsack(w, v, 4000, workers=2, options=eager)
print(os.waitstatus_to_exitcode(status), again == alone, workers.live_worker_pids() == parents)
"""


def test_a_forked_child_starts_its_own_workers_and_leaves_its_parents_alone():
    """A fork (a DataLoader worker, say) inherits the pool's list but not its spawner thread or its
    lock: it forgets the parent's workers and starts its own; the parent keeps its pool."""
    done = subprocess.run([sys.executable, "-c", FORKED], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "True", "True"]
