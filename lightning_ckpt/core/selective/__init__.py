"""Op-level choices for one block: its op calls, its options between keep and full checkpoint, and
selective checkpointing applied with removable hooks (issue 24; the plan across blocks is
:func:`lightning_ckpt.planning.op_plan.make_op_plan`).

``ops`` records the calls, ``options`` builds the frontier, ``policy`` names saved calls the way
``create_selective_checkpoint_contexts`` sees them, ``apply`` wraps modules, ``measure`` times and
sizes, ``costs`` sizes each option on a fake twin.
"""

from lightning_ckpt.core.selective.apply import apply_selective_checkpointing, selective_policy_of
from lightning_ckpt.core.selective.measure import held_bytes
from lightning_ckpt.core.selective.ops import OpCall, record_ops
from lightning_ckpt.core.selective.options import (
    BlockOpProfile,
    BlockOption,
    block_options,
    named_options,
    profile_block,
)
from lightning_ckpt.core.selective.policy import SelectivePolicy

__all__ = [
    "BlockOpProfile",
    "BlockOption",
    "OpCall",
    "SelectivePolicy",
    "apply_selective_checkpointing",
    "block_options",
    "held_bytes",
    "named_options",
    "profile_block",
    "record_ops",
    "selective_policy_of",
]
