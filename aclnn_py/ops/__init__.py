"""The two-phase operator wrappers (one module per op pair), the attributes object they share, and the
sizing arithmetic. :class:`~aclnn_py.MoeDistributeBuffer` is the high-level API over these."""

from . import generations, sizing
from ._compiled import compiled_path_enabled, set_compiled_path
from .combine import CombinePlan, PreparedCombine, moe_distribute_combine, prepare_combine
from .config import MoeConfig
from .dispatch import (
    DispatchOutputs,
    DispatchPlan,
    PreparedDispatch,
    moe_distribute_dispatch,
    prepare_dispatch,
)
from .executor import Plan, Prepared
from .generations import GenerationError
from .profiles import SocProfile, profile_of

__all__ = [
    "CombinePlan", "DispatchOutputs", "DispatchPlan", "GenerationError", "MoeConfig", "Plan", "Prepared", "PreparedCombine",
    "PreparedDispatch", "SocProfile", "compiled_path_enabled", "generations", "moe_distribute_combine", "moe_distribute_dispatch",
    "prepare_combine", "prepare_dispatch", "profile_of", "set_compiled_path", "sizing",
]
