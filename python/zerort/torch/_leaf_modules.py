"""Leaf modules: a module whose whole subtree is one stage-3 unit, gathered around its forward.

At stage 3 each module that owns params is a unit of its own, gathered before its forward
and released after it (_stage3.py). Two kinds of model want coarser units:
- a mixture of experts, whose router sends each rank's tokens to other experts: the ranks
  would run different experts' forwards, and so different gathers (a collective mismatch).
  A leaf MoE block gathers all its experts at once on every rank, whatever the routing;
- a model of many small modules, where each module's hooks and gathers cost more host time
  than its kernels: a leaf block has one set of hooks and one gather per use.

The flag is DeepSpeed's: `module._z3_leaf = True`, set by set_z3_leaf_modules(model,
classes) (also by name or name suffix), so a model flagged with deepspeed.utils'
functions of the same names is read the same. A DeepSpeed config's
`zero_optimization.leaf_module` ({"classes": [...], "names": [...], "name_suffixes": [...]})
and `stage3_module_granularity_threshold` flag modules at initialize(), as DeepSpeed does;
so do, by default, the sparse MoE blocks of Hugging Face's Mixtral, Qwen2-MoE and
Qwen3-MoE (DeepSpeed's default classes). Flag modules before initialize(): the units are
laid out then. Below stage 3 the flag changes nothing.

Inside a leaf nothing is hooked: its children's forwards run while the leaf holds the
unit, and its backward releases it once every trainable param in it has its gradient (an
expert no token reached on this rank: at the step, or earlier under guard.on_unused =
"zero", which an MoE job needs anyway).
"""
import torch

from .. import errors

# DeepSpeed's default leaf classes (leaf_module_config.py): sparse MoE blocks whose routing
# differs between ranks. Matched by their fully qualified names: transformers need not be
# imported.
DEFAULT_CLASSES = (
    "transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock",
    "transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
    "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock",
)

# DeepSpeed's cap on a leaf found by granularity: a larger module is never one.
_MAX_LEAF_PARAMS = 10**9


def z3_leaf_module(module):
    """Whether `module` is flagged as a leaf."""
    return bool(getattr(module, "_z3_leaf", False))


def get_z3_leaf_modules(model):
    """The modules of `model` flagged as leaves, in modules() order."""
    return [module for module in model.modules() if z3_leaf_module(module)]


def _class_matches(module, wanted):
    """Whether `module` is an instance of `wanted` (a class), or of a class whose name or
    fully qualified name (module.Class) is `wanted` (a string)."""
    if isinstance(wanted, type):
        return isinstance(module, wanted)
    cls = type(module)
    return wanted in (cls.__name__, f"{cls.__module__}.{cls.__qualname__}")


def _flag_classes(model, classes, flag, raise_if_not_found):
    classes = list(classes)
    for wanted in classes:
        if not isinstance(wanted, (type, str)):
            raise errors.InvalidArgumentError(
                "zerort.torch: leaf module classes are classes or class names, not "
                f"{wanted!r}")
    found = [module for module in model.modules()
             if any(_class_matches(module, wanted) for wanted in classes)]
    for module in found:
        module._z3_leaf = flag
    if not found and raise_if_not_found:
        names = [c.__name__ if isinstance(c, type) else c for c in classes]
        raise errors.InvalidArgumentError(
            f"zerort.torch: no module of the model is a {' or '.join(names)}; name a class "
            "the model uses (a class, its name, or its module.Class name)")
    return found


def set_z3_leaf_modules(model, leaf_module_classes, raise_if_not_found=True):
    """Flags every module of `model` that is an instance of one of `leaf_module_classes`
    (classes, class names or fully qualified class names) as a leaf; returns them. None
    found: InvalidArgumentError unless `raise_if_not_found` is False."""
    return _flag_classes(model, leaf_module_classes, True, raise_if_not_found)


def unset_z3_leaf_modules(model, leaf_module_classes, raise_if_not_found=True):
    """Clears the leaf flag of the modules set_z3_leaf_modules would flag; returns them."""
    return _flag_classes(model, leaf_module_classes, False, raise_if_not_found)


def _flag_named(model, matches, patterns, what, flag, raise_if_not_found):
    """Sets the leaf flag to `flag` on the modules whose named_modules() name
    matches(name, pattern) for some pattern; returns (them, the patterns that matched
    none)."""
    found, missing = [], []
    named = list(model.named_modules())
    for pattern in patterns:
        hits = [module for name, module in named if matches(name, pattern)]
        if not hits:
            missing.append(pattern)
        for module in hits:
            module._z3_leaf = flag
            if all(module is not other for other in found):
                found.append(module)
    if missing and raise_if_not_found:
        raise errors.InvalidArgumentError(
            f"zerort.torch: no module of the model is {what} {', '.join(map(repr, missing))} "
            "(names as model.named_modules() gives them)")
    return found, missing


def set_z3_leaf_modules_by_name(model, module_names, flag=True, raise_if_not_found=True):
    """Sets the leaf flag (`flag`) of the modules named `module_names` (model.named_modules()
    names); returns (them, the names not found)."""
    return _flag_named(model, lambda name, wanted: name == wanted, module_names, "named",
                       flag, raise_if_not_found)


def set_z3_leaf_modules_by_suffix(model, module_name_suffixes, flag=True,
                                  raise_if_not_found=True):
    """Sets the leaf flag (`flag`) of the modules whose named_modules() name ends with one
    of `module_name_suffixes`; returns (them, the suffixes that matched none)."""
    return _flag_named(model, str.endswith, module_name_suffixes, "named with the suffix",
                       flag, raise_if_not_found)


# Container classes, by name as DeepSpeed tells them (a subclass of nn.Sequential is not one).
_CONTAINERS = frozenset(torch.nn.modules.container.__all__)


def _granularity(module, found):
    """(layers, params) of `module`'s subtree, DeepSpeed's way: a module without children
    that has params is one layer, a container is none, another module with children is one
    more than its children's. Records each module's granularity, params per layer, in
    `found` ({module: granularity}; containers and modules of more than 1e9 params are
    never leaves and get none)."""
    params = sum(p.numel() for p in module.parameters(recurse=False))
    children = list(module.children())
    if not children:
        return (1 if params else 0), params
    layers = 0
    for child in children:
        child_layers, child_params = _granularity(child, found)
        layers += child_layers
        params += child_params
    if type(module).__name__ in _CONTAINERS or params == 0:
        return layers, params
    layers += 1
    if params <= _MAX_LEAF_PARAMS:
        found[module] = params // layers
    return layers, params


def set_leaf_modules_by_granularity(model, threshold):
    """DeepSpeed's stage3_module_granularity_threshold: the outermost modules whose params
    per layer (a module's params over the modules with params in its subtree, itself
    included) are at most `threshold` become leaves; returns them."""
    granularity = {}
    _granularity(model, granularity)
    found = []

    def visit(module):
        if module in granularity and granularity[module] <= threshold:
            module._z3_leaf = True
            found.append(module)
            return
        for child in module.children():
            visit(child)
    visit(model)
    return found


def apply_config(model, raw):
    """Flags the leaves the user's config `raw` names (DeepSpeed's zero_optimization
    leaf_module and stage3_module_granularity_threshold) and DeepSpeed's default classes;
    returns the names, classes or suffixes of the config that matched no module."""
    zero = raw.get("zero_optimization") if isinstance(raw, dict) else None
    zero = zero if isinstance(zero, dict) else {}
    leaf = zero.get("leaf_module", {})
    if not isinstance(leaf, dict) or set(leaf) - {"classes", "names", "name_suffixes"}:
        raise errors.InvalidArgumentError(
            "zerort.torch: zero_optimization.leaf_module must be an object with any of "
            "\"classes\", \"names\" and \"name_suffixes\" (lists of strings), not "
            f"{leaf!r}")
    lists = {}
    for key in ("classes", "names", "name_suffixes"):
        value = leaf.get(key, list(DEFAULT_CLASSES) if key == "classes" else [])
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise errors.InvalidArgumentError(
                f"zerort.torch: zero_optimization.leaf_module.{key} must be a list of "
                f"strings, not {value!r}")
        lists[key] = value
    threshold = zero.get("stage3_module_granularity_threshold", 0)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or threshold < 0:
        raise errors.InvalidArgumentError(
            "zerort.torch: zero_optimization.stage3_module_granularity_threshold must be a "
            f"number of params ≥ 0, not {threshold!r}")
    # Checked whole: only now is the model flagged.
    missing = []
    for wanted in lists["classes"]:  # (a default class the model lacks is not missed)
        if not _flag_classes(model, [wanted], True, False) and wanted not in DEFAULT_CLASSES:
            missing.append(wanted)
    missing += set_z3_leaf_modules_by_name(model, lists["names"], True, False)[1]
    missing += set_z3_leaf_modules_by_suffix(model, lists["name_suffixes"], True, False)[1]
    if threshold > 0:
        set_leaf_modules_by_granularity(model, threshold)
    return missing


def owners(model):
    """(module, its params) for each module of `model` that owns params for stage 3, in
    modules() order: a leaf with every param of its subtree, another module with its own
    (recurse=False). The modules inside a leaf are not listed."""
    inside_leaf = set()
    result = []
    for module in model.modules():
        if id(module) in inside_leaf:
            continue
        if z3_leaf_module(module):
            inside_leaf.update(id(sub) for sub in module.modules() if sub is not module)
            result.append((module, list(module.parameters())))
        else:
            result.append((module, list(module.parameters(recurse=False))))
    return result
