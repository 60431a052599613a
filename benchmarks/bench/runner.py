"""The parent process side of a runner: one persistent child per method, its time limit and memory.

Memory is the growth over the pre-call baseline of the child's own high-water mark (measured in the
child, :mod:`benchmarks.bench.child`) and of the proportional set size of its whole process tree,
sampled here while the call runs.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import subprocess
import sys
import tempfile
import time

from benchmarks.bench.instances import KnapsackInstance

MAX_REPEATS = 5
_SERVE = "from benchmarks.bench.child import _serve_stdio; _serve_stdio()"


def _descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (through ``/proc/<pid>/task/*/children``)."""
    found, stack = [], [pid]
    while stack:
        parent = stack.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as handle:
                    children = [int(c) for c in handle.read().split()]
            except OSError:
                continue
            found += children
            stack += children
    return found


def _cpu_seconds(pids: list[int]) -> float:
    """CPU seconds (user and system, all threads) the live processes ``pids`` have used."""
    ticks = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
        except (OSError, IndexError, ValueError):
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


def _pss_bytes(pids: list[int]) -> int:
    """Total proportional set size of ``pids``: shared pages are split, so the sum counts them once."""
    total_kb = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as handle:
                total_kb += next((int(x.split()[1]) for x in handle if x.startswith("Pss:")), 0)
        except OSError:
            continue
    return 1024 * total_kb


class _Runner:
    """A persistent child process that runs one method; killed with its whole process group on timeout."""

    def __init__(self, method: str, torch_threads: int) -> None:
        self.torch_threads = torch_threads
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
        env = dict(os.environ, PYTHONPATH=path, MALLOC_MMAP_THRESHOLD_="131072")
        command = [sys.executable, "-c", _SERVE]
        self.method = method
        self.log = tempfile.TemporaryFile()  # the child's stderr (solver chatter); its tail shows on a crash
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
            start_new_session=True,
        )

    def call(self, instance: KnapsackInstance, kill_after_s: float, repeat_budget_s: float = 0.0) -> dict:
        """Run the method on ``instance``; a result dict (see ``_timed_calls``) with ``peak_bytes``."""
        request = {
            "method": self.method,
            "weights": instance.weights.tolist(),
            "values": instance.values.tolist(),
            "capacity": instance.capacity,
            "repeat_budget_s": repeat_budget_s,
            "max_repeats": MAX_REPEATS if repeat_budget_s > 0 else 1,
            "torch_threads": self.torch_threads,
        }
        pid = self.process.pid
        baseline_bytes = _pss_bytes([pid, *_descendants(pid)])
        tree_peak_bytes = baseline_bytes
        baseline_cpu_s = _cpu_seconds([pid, *_descendants(pid)])
        pickle.dump(request, self.process.stdin)
        self.process.stdin.flush()
        start = time.perf_counter()
        while not select.select([self.process.stdout], [], [], _sample_interval_s(start))[0]:
            if time.perf_counter() - start > kill_after_s:
                cpu_s = _cpu_seconds([pid, *_descendants(pid)]) - baseline_cpu_s
                self.kill()
                note = f"timeout: killed after {kill_after_s:.0f} s ({cpu_s:.0f} CPU s)"
                return {"status": "timeout", "note": note}
            children = _descendants(pid)
            if children:
                tree_peak_bytes = max(tree_peak_bytes, _pss_bytes([pid, *children]))
        try:
            result = pickle.load(self.process.stdout)
        except EOFError:
            code = self.process.wait()
            return {"status": "error", "note": f"error: runner died (exit {code}): {self._log_tail()}"}
        if result.get("self_peak_bytes") is not None:
            result["peak_bytes"] = max(result["self_peak_bytes"], tree_peak_bytes - baseline_bytes)
        return result

    def _log_tail(self) -> str:
        self.log.seek(0, os.SEEK_END)
        self.log.seek(max(0, self.log.tell() - 300))
        return (
            " ".join(self.log.read().decode(errors="replace").split()[-30:]) or "no message; out of memory?"
        )

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """Kill the runner and every process it started (they share its process group)."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except OSError:
            pass
        self.process.wait()

    def close(self, wait: bool = True) -> None:
        """Ask the runner to exit (end of its input); with ``wait``, kill it if it has not within 10 s."""
        try:
            self.process.stdin.close()
        except OSError:  # the runner is gone already (killed, or it crashed)
            pass
        if wait:
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
            self.log.close()


def _sample_interval_s(start: float) -> float:
    """Memory sampling period: fine at first (short peaks), coarser later (less CPU taken from the run)."""
    elapsed_s = time.perf_counter() - start
    return 0.005 if elapsed_s < 0.2 else 0.02 if elapsed_s < 5.0 else 0.1
