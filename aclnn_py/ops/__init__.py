"""Two-phase wrappers of the bound aclnn operators (one module per op pair)."""

from .moe_distribute_combine import CombinePlan, PreparedCombine, moe_distribute_combine, prepare_combine
from .moe_distribute_dispatch import (
    DispatchOutputs,
    DispatchPlan,
    PreparedDispatch,
    moe_distribute_dispatch,
    prepare_dispatch,
)

__all__ = [
    "CombinePlan", "DispatchPlan", "DispatchOutputs", "PreparedCombine", "PreparedDispatch", "moe_distribute_combine",
    "moe_distribute_dispatch", "prepare_combine", "prepare_dispatch",
]
