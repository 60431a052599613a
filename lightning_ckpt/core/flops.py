"""FLOPs of a profiled step counted by torch's own counter, without what only its per-module table needs."""

from __future__ import annotations

from typing import Any

from torch.utils.flop_counter import FlopCounterMode, _FlopCounterMode  # the latter private (torch 2.13)

__all__ = ["TotalFlopCounter"]


class TotalFlopCounter(FlopCounterMode):
    """``FlopCounterMode``'s count, totals only: its own dispatch mode (decompositions included, so the
    ops below it are the same) without the module tracker that only its per-module table needs, whose
    hooks cost a fake profile 3-7% (the recorder splits the total per candidate itself)."""

    def __enter__(self) -> TotalFlopCounter:
        self.flop_counts.clear()
        self.mode = _FlopCounterMode(self)
        self.mode.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> Any:
        mode, self.mode = self.mode, None
        return mode.__exit__(*exc_info)
