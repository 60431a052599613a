"""Test-wide settings: one intra-op thread per test process.

Tests are tiny; on a 2-core machine shared with other work, two OpenMP threads per process
oversubscribe the cores and make CPU steps tens of times slower without testing anything more.
"""

import torch

torch.set_num_threads(1)
