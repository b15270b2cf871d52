"""The config and the param groups initialize() is given, made into ZeroRT's config.

A config is a dict, JSON text or a path to a .json file, in ZeroRT's format or DeepSpeed's
(zero_optimization, bf16, optimizer with "params", scheduler, gradient_clipping, ...). It is
always passed through the library's zero_config_normalize, so the Python side reads the same
ZeroRT config the engine is built from, whichever format it was written in.

`model_parameters` (as deepspeed.initialize's) is an iterable of params, or a list of param
groups in PyTorch's format ({"params": [...], "lr": ..., "weight_decay": ..., ...}). Group i's
keys become optimizer.param_groups[i] of the config (keys it leaves out come from the config's
optimizer), and each trainable param is registered with its group's index.
"""
import torch

from .. import core, errors

# PyTorch's param-group keys that map onto ZeroRT's optimizer groups.
GROUP_KEYS = ("lr", "betas", "eps", "weight_decay", "momentum", "dampening", "nesterov")


def load(config, world_size):
    """(the normalized ZeroRT config, the config as the user gave it), both dicts. What the
    user's own config says matters where the normalized one cannot tell a default from a
    choice (the device: a config that names none lets the model's params decide). A
    DeepSpeed config with train_batch_size and train_micro_batch_size_per_gpu but no
    gradient_accumulation_steps gets it derived with `world_size`, as DeepSpeed does."""
    raw = core.config_dict(config)
    if not isinstance(raw, dict):
        raise errors.InvalidArgumentError(
            f"zerort.torch: the config must be a JSON object, not {type(raw).__name__}")
    return core.normalize_config(_with_derived_accumulation(raw, world_size)), raw


def _with_derived_accumulation(raw, world_size):
    """`raw` with DeepSpeed's gradient_accumulation_steps = train_batch_size /
    (train_micro_batch_size_per_gpu × world size) where it leaves that out or says "auto"
    and the division is whole (else as it is: the engine names what does not fit)."""
    train, micro = raw.get("train_batch_size"), raw.get("train_micro_batch_size_per_gpu")
    if (raw.get("gradient_accumulation_steps", "auto") != "auto" or not isinstance(train, int)
            or not isinstance(micro, int) or isinstance(train, bool) or micro <= 0
            or train <= 0 or train % (micro * world_size) != 0):
        return raw
    return dict(raw, gradient_accumulation_steps=train // (micro * world_size))


def refuse_sparse_gradients(module):
    """Trainable embeddings built with sparse=True (nn.Embedding, nn.EmbeddingBag) give
    sparse gradients, which ZeroRT does not reduce: an InvalidArgumentError naming the
    param, at initialize() rather than inside backward."""
    for prefix, sub in module.named_modules():
        if not isinstance(sub, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
            continue
        if getattr(sub, "sparse", False) and sub.weight.requires_grad:
            name = f"{prefix}.weight" if prefix else "weight"
            raise errors.InvalidArgumentError(
                f"zerort.torch: param \"{name}\" belongs to a {type(sub).__name__} with "
                "sparse=True, whose gradients are sparse; ZeroRT reduces dense gradients only. "
                "Build it with sparse=False (the default), or freeze it.")


def cast_to_precision(module, config, cast_sharded=None):
    """A config whose precision.param is bf16 or fp16 (DeepSpeed's "bf16"/"fp16" enabled) casts
    a module that still has float32 params to it, as deepspeed.initialize does; a module
    already in a 16-bit dtype, or a float32 config, is left as it is. `cast_sharded(module,
    dtype)` first casts the params init_context sharded (module.to would read them)."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(
        config.get("precision", {}).get("param", "fp32"))
    if dtype is not None and any(p.dtype == torch.float32 for p in module.parameters()):
        if cast_sharded is not None:
            cast_sharded(module, dtype)
        module.to(dtype)


def stage(config):
    """The ZeRO stage (the engine's default, 2, when the config names none)."""
    return int(config.get("stage", 2))


def has_scheduler(config):
    """Whether the config has a learning-rate schedule the engine steps."""
    scheduler = config.get("scheduler")
    return bool(scheduler) and str(scheduler.get("type", "none")).lower() != "none"


def optimizer_type(config):
    """The optimizer's type, lower case ("adamw" when the config names none)."""
    return str(config.get("optimizer", {}).get("type", "adamw")).lower()


def initial_loss_scale(config):
    """The loss scale of the first step (1 without loss scaling)."""
    scale = config.get("loss_scale", {})
    if scale.get("mode", "none") == "none":
        return 1.0
    return 2.0 ** scale.get("initial_power", 16)


class ParamGroups:
    """Which group each trainable param is in, and what each group overrides.

    `group_of`: {param: group index} (empty: every param in group 0); `overrides`: one dict
    per group in the config's param_groups format, or None when no groups were given."""

    def __init__(self, group_of=None, overrides=None, extras=None):
        self.group_of = group_of or {}
        self.overrides = overrides
        self.extras = extras or []  # per group: the trainer's own keys (group_extras)

    def group(self, param):
        """The group index of a trainable param."""
        return self.group_of.get(param, 0)


def _as_float(value, what):
    if isinstance(value, torch.Tensor):
        value = value.item()
    try:
        return float(value)
    except (TypeError, ValueError):
        raise errors.InvalidArgumentError(
            f"zerort.torch: {what} must be a number, not {value!r}") from None


# PyTorch's optimizer options that pick an implementation, or are off (group_extras checks those).
TORCH_OPTIONS = ("amsgrad", "maximize", "foreach", "fused", "capturable", "differentiable",
                  "decoupled_weight_decay")


def refuse_step_changing_options(group, what, adamw=False):
    """An UnimplementedError when param group `group` (PyTorch's format; `what` names it)
    turns on one of PyTorch's options that would change the step: amsgrad, maximize,
    decoupled_weight_decay (but where the engine is `adamw`: newer PyTorch's AdamW is Adam
    with it)."""
    for option in ("amsgrad", "maximize", "decoupled_weight_decay"):
        if option == "decoupled_weight_decay" and adamw:
            continue
        if group.get(option):
            raise errors.UnimplementedError(
                f"zerort.torch: {what} sets {option}=True, which ZeroRT's optimizers do not "
                "do per group" + (" (the config's optimizer.type picks adam or adamw)"
                                  if option == "decoupled_weight_decay" else ""),
                errors.UnimplementedError.status)


def group_extras(group, index):
    """The keys of param group `group` (PyTorch's format) that are no hyperparameter of
    ZeroRT's: the trainer's own (a group's "name", timm's "lr_scale"), kept in
    engine.optimizer.param_groups as PyTorch keeps them. PyTorch's options that would change
    the step (amsgrad, maximize, decoupled_weight_decay) are an UnimplementedError naming
    them; those that only pick
    PyTorch's implementation (foreach, fused, ...) are dropped."""
    refuse_step_changing_options(group, f"model_parameters group {index}")
    return {key: value for key, value in group.items()
            if key not in GROUP_KEYS and key not in TORCH_OPTIONS and key != "params"}


def group_overrides(group, index):
    """Param group `group` (PyTorch's format) as the config's optimizer.param_groups[index]
    entry (its hyperparameters: group_extras has the rest)."""
    overrides = {}
    for key in GROUP_KEYS:
        if key not in group:
            continue
        value = group[key]
        what = f"model_parameters group {index}'s {key}"
        if key == "betas":
            if isinstance(value, torch.Tensor):
                value = value.tolist()
            if not isinstance(value, (list, tuple)):
                raise errors.InvalidArgumentError(
                    f"zerort.torch: {what} must be two numbers, not {value!r}")
            betas = [_as_float(b, what) for b in value]
            if len(betas) != 2:
                raise errors.InvalidArgumentError(f"zerort.torch: {what} must be two numbers")
            overrides[key] = betas
        elif key == "nesterov":
            overrides[key] = bool(value)
        else:
            overrides[key] = _as_float(value, what)
    return overrides


def resolve_param_groups(module, model_parameters):
    """ParamGroups for `module` from `model_parameters` (None: every trainable param in one
    group). Frozen params in a group are skipped (they are never stepped); a trainable param
    of `module` in no group, a param in two groups, and a tensor that is not a param of
    `module` are InvalidArgumentErrors naming them."""
    if model_parameters is None:
        return ParamGroups()
    if isinstance(model_parameters, torch.Tensor):
        model_parameters = [model_parameters]
    elif isinstance(model_parameters, dict):
        model_parameters = [model_parameters]
    try:
        items = list(model_parameters)
    except TypeError:
        raise errors.InvalidArgumentError(
            "zerort.torch: model_parameters must be params or a list of param groups, not "
            f"a {type(model_parameters).__name__}") from None
    if not items:
        raise errors.InvalidArgumentError(
            "zerort.torch: model_parameters is empty; pass model.parameters(), a list of "
            "param groups, or leave it out")
    # Params, (name, param) pairs (named_parameters()), or param-group dicts.
    dicts = [isinstance(item, dict) for item in items]
    if all(dicts):
        groups = items
    elif not any(dicts):
        groups = [{"params": items}]
    else:
        raise errors.InvalidArgumentError(
            "zerort.torch: model_parameters mixes params and param-group dicts; pass either "
            "params or a list of dicts {\"params\": [...], ...}")
    names = {}
    for name, param in module.named_parameters():
        names.setdefault(param, name)
    group_of, overrides, extras = {}, [], []
    for index, group in enumerate(groups):
        if "params" not in group:
            raise errors.InvalidArgumentError(
                f"zerort.torch: model_parameters group {index} has no \"params\"")
        overrides.append(group_overrides(group, index))
        extras.append(group_extras(group, index))
        params = group["params"]
        try:
            params = [params] if isinstance(params, torch.Tensor) else list(params)
        except TypeError:
            raise errors.InvalidArgumentError(
                f"zerort.torch: model_parameters group {index}'s \"params\" must be params, "
                f"not a {type(params).__name__}") from None
        for param in params:
            if isinstance(param, tuple) and len(param) == 2:  # named_parameters()' pairs
                param = param[1]
            if not isinstance(param, torch.Tensor):
                raise errors.InvalidArgumentError(
                    f"zerort.torch: model_parameters group {index} holds a "
                    f"{type(param).__name__}, not a param")
            if param not in names:
                raise errors.InvalidArgumentError(
                    f"zerort.torch: model_parameters group {index} holds a tensor of shape "
                    f"{tuple(param.shape)} that is not a parameter of the model")
            if not param.requires_grad:
                continue  # frozen: never stepped (sharded at stage 3, in no group)
            previous = group_of.setdefault(param, index)
            if previous != index:
                raise errors.InvalidArgumentError(
                    f"zerort.torch: param {names[param]} is in model_parameters groups "
                    f"{previous} and {index}; a param belongs to one group")
    missing = [name for param, name in names.items()
               if param.requires_grad and param not in group_of]
    if missing:
        raise errors.InvalidArgumentError(
            "zerort.torch: trainable params in no group of model_parameters: "
            f"{', '.join(missing)}; add each to a group, or set requires_grad=False on it "
            "(frozen params are never stepped)")
    return ParamGroups(group_of, overrides, extras)


def with_param_groups(config, overrides):
    """`config` with `overrides` (one dict per group) applied over its
    optimizer.param_groups (a group's own keys win over the config's entry for it)."""
    if not overrides:
        return config
    config = dict(config)
    optimizer = dict(config.get("optimizer", {}))
    existing = list(optimizer.get("param_groups", []))
    count = max(len(existing), len(overrides))
    optimizer["param_groups"] = [
        dict(existing[i] if i < len(existing) else {},
             **(overrides[i] if i < len(overrides) else {}))
        for i in range(count)]
    config["optimizer"] = optimizer
    return config
