"""The solver under faults: Ctrl-C of the process or of its group, a killed or stopped worker,
SIGKILL of the whole group or of the caller alone (its workers running or stopped), no room for
shared memory, more workers than CPUs, an idle pool.

Signals go to subprocesses (``solver_fault_script.py``, each in a session of its own), never to
the pytest process.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from lightning_ckpt.solver import SolverOptions, solve_knapsack
from lightning_ckpt.solver.runtime import cpus, pool
from lightning_ckpt.solver.runtime import workers as solver_workers

SCRIPT = Path(__file__).resolve().parent / "solver_fault_script.py"
EAGER = SolverOptions(
    parallel_min_solve_cells=0, parallel_min_task_cells=0, leaf_max_cells=0, sparse_max_states=0
)
KERNEL_RUNNING_S = 0.7  # after "ready": the long solve is deep in its kernels by then
INTERRUPT_BOUND_S = 3.0  # Ctrl-C to the end of the interrupted solve, on a busy CI machine

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="Linux-only fault handling")


def _start(workers: int | str, kernel: str = "numba") -> tuple[subprocess.Popen, list[int]]:
    child = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(workers)],
        env=os.environ | {"LIGHTNING_CKPT_NO_NUMBA": "1" if kernel == "numpy" else "0"},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: killpg cannot reach pytest
    )
    words = child.stdout.readline().split()
    assert words[:1] == ["ready"], words
    time.sleep(KERNEL_RUNNING_S)
    return child, [int(pid) for pid in words[1:]]


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0]
    except FileNotFoundError:
        return True
    return state in "ZX"  # a zombie waiting for init to reap it runs nothing


def _wait_stopped(pid: int, timeout_s: float = 10.0) -> None:
    """Wait until SIGSTOP has taken effect: on a loaded machine a sleeping process stops only once it runs."""
    deadline = time.monotonic() + timeout_s
    while Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] not in "Tt":
        assert time.monotonic() < deadline, f"worker {pid} did not stop within {timeout_s} s"
        time.sleep(0.01)


@pytest.mark.parametrize(
    ("workers", "to_group", "kernel"),
    [
        (2, False, "numba"),
        (2, True, "numba"),
        (1, False, "numba"),
        (1, False, "numpy"),
        ("ilp", False, "numba"),
        ("capped", False, "numba"),
        ("capped", False, "numpy"),
    ],
    ids=[
        "process-workers2",
        "group-workers2",
        "process-workers1",
        "process-workers1-numpy",
        "process-ilp",
        "process-capped",
        "process-capped-numpy",
    ],
)
def test_ctrl_c_stops_the_solve_within_a_second_and_later_solves_are_exact(workers, to_group, kernel):
    child, _ = _start(workers, kernel)
    try:
        sent = time.monotonic()
        if to_group:
            os.killpg(child.pid, signal.SIGINT)  # the workers see it too, and ignore it
        else:
            os.kill(child.pid, signal.SIGINT)
        assert child.stdout.readline().strip() == "interrupted"
        seconds_to_interrupt = time.monotonic() - sent
        assert child.stdout.readline().strip() == "exact"  # fresh workers: no stale pid, no stale answer
        assert child.wait(timeout=30) == 0
    finally:
        child.kill()
    # the interrupt leaves once the solve's helper thread has ended (its kernel stops before its next
    # group of items): 0.1 s in one process, up to 1.8 s with two on this loaded 2-core VM. (On
    # Python 3.11 it used to leave at once, the solve still running behind it.)
    assert seconds_to_interrupt < INTERRUPT_BOUND_S


def test_workers_end_when_their_parent_is_killed_alone_mid_kernel():
    """``kill -9`` of the caller only (not its group): the orphaned workers stop within about a second."""
    child, worker_pids = _start(2)
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=10)
    deadline = time.monotonic() + 5
    while not all(_gone(pid) for pid in worker_pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert worker_pids and all(_gone(pid) for pid in worker_pids)
    assert time.monotonic() < deadline


@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL], ids=["stopped", "killed"])
def test_a_stopped_or_killed_worker_ends_the_solve_promptly_with_a_clear_error(sig):
    """A worker stopped mid-solve would block its caller for ever; one killed was noticed only after
    the caller's own task (1.4-9 s). Now: WorkerDied within the stop grace (1 s) or at once."""
    child, worker_pids = _start(2)
    try:
        sent = time.monotonic()
        os.kill(worker_pids[0], sig)
        words = child.stdout.readline().split(maxsplit=1)
        seconds_to_error = time.monotonic() - sent
        assert child.stdout.readline().strip() == "exact"  # the pool was reset: fresh workers, exact
        assert child.wait(timeout=30) == 0
    finally:
        child.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker_pids[0], signal.SIGKILL)  # a stopped one ends too
    how = "was stopped (SIGSTOP or a debugger) for 1 s" if sig == signal.SIGSTOP else "exited with code -9"
    assert words[0] == "died" and f"(pid {worker_pids[0]}) {how}; its pool was reset" in words[1], words
    assert seconds_to_error < (1.0 + 3.0 if sig == signal.SIGSTOP else 3.0), seconds_to_error  # loaded CI
    assert _gone(worker_pids[0])


def test_a_stopped_worker_ends_within_a_second_of_its_parent():
    """``kill -9`` of the caller while its worker is stopped: a stopped process runs no watch, but
    the kernel's parent-death SIGKILL ends it too."""
    child, worker_pids = _start(2)
    os.kill(worker_pids[0], signal.SIGSTOP)
    time.sleep(0.2)
    killed = time.monotonic()
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=10)
    while not _gone(worker_pids[0]) and time.monotonic() < killed + 5:
        time.sleep(0.01)
    seconds_to_gone = time.monotonic() - killed
    with contextlib.suppress(ProcessLookupError):
        os.kill(worker_pids[0], signal.SIGKILL)
    assert seconds_to_gone < 1.0, seconds_to_gone


def _shared_files(pid: int) -> set[str]:
    """The shared-memory files process ``pid`` maps or holds open: ``/dev/shm`` names and memfds.

    (The machine's /dev/shm is shared with other processes, so listing it alone proves nothing.)
    """
    paths = {line.split(maxsplit=5)[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines()}
    fds = Path(f"/proc/{pid}/fd")
    paths |= {os.readlink(fds / fd) for fd in os.listdir(fds) if (fds / fd).is_symlink()}
    return {p for p in paths if p.startswith(("/dev/shm/", "/memfd:"))}


def test_sigkill_of_the_group_leaves_nothing_in_dev_shm():
    child, worker_pids = _start(2)
    during = {pid: _shared_files(pid) for pid in [child.pid, *worker_pids]}
    os.killpg(child.pid, signal.SIGKILL)
    child.wait(timeout=10)
    deadline = time.monotonic() + 10
    while not all(_gone(pid) for pid in worker_pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert worker_pids and all(_gone(pid) for pid in worker_pids)  # no process left to hold the memfd
    for pid, files in during.items():  # mid-solve: the arena is a memfd in every process, never a file
        assert any(f.startswith("/memfd:lightning-ckpt-arena") for f in files), (pid, files)
        assert not any(f.startswith("/dev/shm/") for f in files), (pid, files)


def _in_a_small_dev_shm(command: list[str]) -> list[str]:
    """``command`` in a private mount namespace whose /dev/shm is a 1 MiB tmpfs (Docker's default
    is 64 MiB); the machine's own /dev/shm is untouched."""
    mount = 'mount -t tmpfs -o size=1m tmpfs /dev/shm && exec "$@"'
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", mount, "sh", *command]


def test_a_tiny_dev_shm_does_not_limit_the_workers():
    probe = (
        subprocess.run(_in_a_small_dev_shm(["true"]), capture_output=True)
        if shutil.which("unshare")
        else None
    )
    if probe is None or probe.returncode != 0:
        pytest.skip("needs `unshare -m` and `mount` (root, CAP_SYS_ADMIN)")
    done = subprocess.run(
        _in_a_small_dev_shm([sys.executable, str(SCRIPT), "small-shm"]),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["exact", str(2**20)]  # 48 MB shared by two processes, /dev/shm of 1 MiB


def _instance(seed: int = 3) -> tuple[np.ndarray, np.ndarray, int]:
    rng = np.random.default_rng(seed)
    weights = rng.integers(1, 300, 80)
    return weights, weights * rng.uniform(0.9, 1.1, 80), 4_000


def test_a_killed_worker_raises_a_clear_error_and_the_next_solve_starts_fresh(monkeypatch):
    weights, values, capacity = _instance()
    reference = solve_knapsack(weights, values, capacity)
    solve_knapsack(weights, values, capacity, workers=2, options=EAGER)  # the pool is up
    victim = solver_workers.live_worker_pids()[0]
    real_run = pool.PoolExecutor.run

    def run_after_a_kill(self, tasks):
        if not _gone(victim):
            os.kill(victim, signal.SIGKILL)
            while not _gone(victim) and solver_workers._POOL[0].proc.poll() is None:
                time.sleep(0.01)
        return real_run(self, tasks)

    monkeypatch.setattr(pool.PoolExecutor, "run", run_after_a_kill)
    with pytest.raises(
        RuntimeError, match=r"worker process \(pid \d+\) exited with code -9; its pool was reset"
    ):
        solve_knapsack(weights, values, capacity, workers=2, options=EAGER)
    assert solver_workers.live_worker_pids() == []
    result = solve_knapsack(weights, values, capacity, workers=2, options=EAGER)
    assert result == reference and result.stats.workers_used == 2
    assert victim not in solver_workers.live_worker_pids()


def test_a_worker_stopped_between_solves_is_replaced_before_the_next_one():
    weights, values, capacity = _instance()
    solve_knapsack(weights, values, capacity, workers=2, options=EAGER)  # the pool is up
    victim = solver_workers.live_worker_pids()[0]
    os.kill(victim, signal.SIGSTOP)
    _wait_stopped(victim)
    try:
        result = solve_knapsack(weights, values, capacity, workers=2, options=EAGER)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
    assert result == solve_knapsack(weights, values, capacity) and result.stats.workers_used == 2
    assert victim not in solver_workers.live_worker_pids() and _gone(victim)


def _no_room(monkeypatch) -> None:
    def refuse(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", refuse)


@pytest.mark.parametrize(
    ("limit", "reason"),
    [
        (_no_room, r"No space left on device"),
        (
            lambda monkeypatch: monkeypatch.delattr(os, "memfd_create"),
            r"memfd is not available on this system",
        ),
    ],
    ids=["no-room", "no-memfd"],
)
def test_without_shared_memory_the_solve_runs_in_one_process_with_one_warning(monkeypatch, limit, reason):
    limit(monkeypatch)
    weights, values, capacity = _instance()
    pattern = rf"cannot reserve .* GiB of shared memory for the knapsack solver's workers \({reason}\); solving in one"
    with pytest.warns(RuntimeWarning, match=pattern) as caught:
        result = solve_knapsack(weights, values, capacity, workers=2, options=EAGER)
    assert len(caught) == 1
    assert result == solve_knapsack(weights, values, capacity) and result.stats.workers_used == 1


def test_workers_are_capped_at_the_usable_cpus(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    weights, values, capacity = _instance()
    with pytest.warns(
        RuntimeWarning, match=r"`workers=64` is more than the 1 CPUs this process may use; using 1"
    ):
        result = solve_knapsack(weights, values, capacity, workers=64, options=EAGER)
    assert result.stats.workers_used == 1 and result == solve_knapsack(weights, values, capacity)


def test_workers_are_capped_at_the_cgroup_cpu_quota(monkeypatch, tmp_path):
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("150000 100000\n")  # 1.5 CPUs: one whole CPU for the solver
    monkeypatch.setattr(cpus, "_CGROUP_CPU_MAX", cpu_max)
    weights, values, capacity = _instance()
    with pytest.warns(
        RuntimeWarning, match=r"`workers=2` is more than the 1 CPUs this process may use; using 1"
    ):
        result = solve_knapsack(weights, values, capacity, workers=2, options=EAGER)
    assert result.stats.workers_used == 1 and result == solve_knapsack(weights, values, capacity)


def test_an_idle_pool_is_released(monkeypatch):
    monkeypatch.setattr(solver_workers, "IDLE_RELEASE_S", 0.1)
    weights, values, capacity = _instance()
    solve_knapsack(weights, values, capacity, workers=2, options=EAGER)
    pids = solver_workers.live_worker_pids()
    deadline = time.monotonic() + 10
    while solver_workers.live_worker_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pids and solver_workers.live_worker_pids() == [] and all(_gone(pid) for pid in pids)
