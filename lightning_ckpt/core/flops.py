"""FLOPs of a profiled step counted by torch's own counter, without what only its per-module table needs.

Example:
    >>> import torch
    >>> with TotalFlopCounter(display=False) as counter:
    ...     _ = torch.ones(2, 3) @ torch.ones(3, 4)
    >>> counter.get_total_flops()
    48
"""

from __future__ import annotations

from typing import Any

from torch.utils.flop_counter import FlopCounterMode

from lightning_ckpt._compat import FlopDispatchMode

__all__ = ["TotalFlopCounter"]


class TotalFlopCounter(FlopCounterMode):
    """``FlopCounterMode``'s count, totals only: its own dispatch mode (decompositions included, so the
    ops below it are the same) without the module tracker that only its per-module table needs, whose
    hooks cost a fake profile 3-7% (the recorder splits the total per candidate itself). On a torch
    without that separate mode (2.4) it is ``FlopCounterMode`` as it is."""

    def __enter__(self) -> TotalFlopCounter:
        if FlopDispatchMode is None:
            return super().__enter__()
        self.flop_counts.clear()
        self.mode = FlopDispatchMode(self)
        self.mode.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> Any:
        if FlopDispatchMode is None:
            return super().__exit__(*exc_info)
        mode, self.mode = self.mode, None
        return mode.__exit__(*exc_info)
