"""deepspeed.utils's calls under their DeepSpeed names: the stage-3 leaf modules
(set_z3_leaf_modules and its kin, zerort.torch's), the full state of one param
(safe_get_full_fp32_param, safe_get_full_optimizer_state, safe_get_full_grad and the two
safe_set_full_* calls), and
zero_to_fp32 (the model's fp32 state dict from a checkpoint, in one process)."""
from ..._full_state import (safe_get_full_fp32_param, safe_get_full_grad,
                           safe_get_full_optimizer_state, safe_set_full_fp32_param,
                           safe_set_full_optimizer_state)
from ..._leaf_modules import (get_z3_leaf_modules, set_z3_leaf_modules,
                             set_z3_leaf_modules_by_name, set_z3_leaf_modules_by_suffix,
                             unset_z3_leaf_modules, z3_leaf_module)
from . import zero_to_fp32

__all__ = ["set_z3_leaf_modules", "unset_z3_leaf_modules", "get_z3_leaf_modules",
           "z3_leaf_module", "set_z3_leaf_modules_by_name", "set_z3_leaf_modules_by_suffix",
           "safe_get_full_fp32_param", "safe_get_full_optimizer_state", "safe_get_full_grad",
           "safe_set_full_fp32_param", "safe_set_full_optimizer_state", "zero_to_fp32"]
