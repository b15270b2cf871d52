"""engine.optimizer: a torch.optim.Optimizer whose param_groups are the engine's groups.

The engine owns the optimizer (its states live sharded in the library); this object is the
face PyTorch code expects of one, so that any torch.optim.lr_scheduler (LambdaLR,
CosineAnnealingLR, OneCycleLR, SequentialLR, ...) works on it unchanged:

- `param_groups[i]` is group i of the engine, with the params registered in it and its
  hyperparameters under PyTorch's names: "lr", "betas", "eps", "weight_decay" (SGD: "lr",
  "momentum", "dampening", "nesterov", "weight_decay"), plus what schedulers add
  ("initial_lr", ...). At every optimizer step the values are read, and those that changed
  are pushed to the engine (zero_set_group_hyper) before it steps.
- After each step, values the engine changed itself (a config scheduler's lr) are read back
  into param_groups; load_checkpoint reads back every group's restored hyperparameters. With
  a config scheduler the engine sets every group's lr before each step, so an lr set here
  (or by a PyTorch scheduler) is overridden: use one or the other.
- `engine.step()` steps through `optimizer.step` (the attribute, which PyTorch's lr
  schedulers wrap to see that the optimizer stepped), so the usual loop
  `loss.backward(); engine.step(); scheduler.step()` raises no "lr_scheduler.step() before
  optimizer.step()" warning.
"""
import math
import struct
import warnings

import torch

from .. import errors
from . import _config

# The hyperparameters each optimizer type reads, under PyTorch's names.
_SGD_KEYS = ("lr", "momentum", "dampening", "nesterov", "weight_decay")
_ADAM_KEYS = ("lr", "betas", "eps", "weight_decay")


def _f32(value):
    """`value` rounded to float32, as the engine stores it."""
    return struct.unpack("f", struct.pack("f", float(value)))[0]


def readable(value):
    """The shortest decimal that is the same float32 as `value` (0.01 for 0.009999999776,
    the engine's float32 0.01), element-wise for a tuple; bools as they are."""
    if isinstance(value, tuple):
        return tuple(readable(v) for v in value)
    if isinstance(value, bool) or not math.isfinite(value):
        return value
    for digits in range(1, 10):
        shortest = float(f"{value:.{digits}g}")
        if _f32(shortest) == _f32(value):
            return shortest
    return value


def _torch_values(hyper, keys):
    """The engine's hyperparameters (core.HYPER_FIELDS) as PyTorch's group keys."""
    values = {}
    for key in keys:
        if key == "betas":
            values[key] = (hyper["beta1"], hyper["beta2"])
        elif key == "nesterov":
            values[key] = bool(hyper[key])
        else:
            values[key] = hyper[key]
    return values


def _engine_fields(group, keys):
    """A param group's values as the engine's fields (floats rounded to float32)."""
    fields = {}
    for key in keys:
        value = group[key]
        if key == "betas":
            beta1, beta2 = (v.item() if isinstance(v, torch.Tensor) else v for v in value)
            fields["beta1"], fields["beta2"] = _f32(beta1), _f32(beta2)
        elif key == "nesterov":
            fields[key] = bool(value)
        else:
            fields[key] = _f32(value.item() if isinstance(value, torch.Tensor) else value)
    return fields


def _prefer_exact(engine_value, given):
    """The user's own value where it is the engine's (float32) one, so that param_groups
    show what the user gave; else the engine's, as its shortest decimal (0.01 rather than
    0.009999999776)."""
    if given is None:
        return readable(engine_value)
    if isinstance(engine_value, tuple):
        given = tuple(given)
        same = len(given) == len(engine_value) and all(
            _f32(g) == e for g, e in zip(given, engine_value))
        return tuple(float(g) for g in given) if same else readable(engine_value)
    if isinstance(engine_value, bool):
        return engine_value
    return float(given) if _f32(given) == engine_value else readable(engine_value)


class ZeroOptimizer(torch.optim.Optimizer):
    """The engine's optimizer as a torch.optim.Optimizer (see the module's docstring).

    step(closure=None): runs `closure` (if given, with gradients enabled) and then does what
    engine.step() does: ends the micro-batch, and every gradient_accumulation_steps
    micro-batches steps the optimizer with the param_groups' current values. So a loop
    ported from PyTorch (`loss.backward(); optimizer.step(); optimizer.zero_grad()`) trains
    as before; call engine.step() or optimizer.step() once per micro-batch, not both.
    Returns the closure's loss (None without one), as PyTorch's optimizers do.

    zero_grad(set_to_none=True): a param's gradient goes to the engine as soon as autograd
    has it, and the engine zeroes its gradients when it steps. After step() this only clears
    any `.grad` left on the params, so `backward(); step(); zero_grad()` accumulates over
    gradient_accumulation_steps micro-batches as before. After a backward that no step()
    followed (a batch rejected once its loss or gradients are seen, a GAN's generator loss
    through this model), it drops what the engine holds for the next optimizer step: that
    backward's gradients and those of the accumulation window's earlier micro-batches, as
    PyTorch's zero_grad drops everything accumulated. Every rank must make the same call
    (the drop is collective).

    state_dict()/load_state_dict(): PyTorch's, holding the param groups' hyperparameters
    (lr schedulers' keys included) and no optimizer state: the moments and fp32 masters are
    in the engine, saved by engine.save_checkpoint. Both warn once (UserWarning) that a
    resume from them alone restarts the moments: a loop that saves
    `optimizer.state_dict()` beside the model (as PyTorch's, FSDP's and HF's do) would
    otherwise resume on another trajectory without a word.

    add_param_group(): after initialize, params cannot join the engine (UnimplementedError);
    give every group to initialize(model_parameters=...).
    """

    def __init__(self, engine, config, param_groups):
        """`engine`: the TorchEngine; `config`: its normalized config; `param_groups`: its
        _config.ParamGroups."""
        self._engine = engine
        self._from_engine = False  # engine.step() is stepping through self.step
        self._warned_no_moments = False
        core_engine = engine.engine
        self._keys = _SGD_KEYS if _config.optimizer_type(config) == "sgd" else _ADAM_KEYS
        self._adamw = _config.optimizer_type(config) == "adamw"
        optimizer = config.get("optimizer", {})
        overrides = param_groups.overrides or []
        count = core_engine.num_groups
        self._known = [core_engine.group_hyper(g) for g in range(count)]
        groups = []
        for group in range(count):
            given = dict(optimizer, **(overrides[group] if group < len(overrides) else {}))
            values = _torch_values(self._known[group], self._keys)
            values = {k: _prefer_exact(v, given.get(k)) for k, v in values.items()}
            params = [p for _, p, _ in engine._params if param_groups.group(p) == group]
            params += [p for _, p in engine._empty if param_groups.group(p) == group]
            extras = param_groups.extras[group] if group < len(param_groups.extras) else {}
            groups.append(dict(extras, **values, params=params))
        defaults = _torch_values(self._known[0], self._keys) if count else {}
        defaults = {k: _prefer_exact(v, optimizer.get(k)) for k, v in defaults.items()}
        self._adding_allowed = True
        super().__init__(groups or [{"params": []}], defaults)
        self._adding_allowed = False

    @property
    def overflow(self):
        """DeepSpeed's optimizer.overflow: whether the loss scaler skipped the last optimizer
        step (an inf or NaN gradient)."""
        info = self._engine._last_info
        return info is not None and bool(info["skipped"])

    @property
    def cur_scale(self):
        """DeepSpeed's optimizer.cur_scale: the loss scale now (1.0 without loss scaling)."""
        return self._engine.loss_scale

    loss_scale = cur_scale  # DeepSpeed's other name for it

    def add_param_group(self, param_group):
        """Only while initialize() builds the groups (see the class docstring)."""
        if not self._adding_allowed:
            raise errors.UnimplementedError(
                "zerort.torch: params cannot join the engine after initialize(); pass every "
                "group to initialize(model, config, model_parameters=[...])")
        super().add_param_group(param_group)

    # torch's GradScaler (torch.cuda.amp, FSDP's ShardedGradScaler) then hands its scale to
    # step(): as the grad_scaler keyword (PyTorch 1.x) or as the found_inf attribute (2.x).
    _step_supports_amp_scaling = True

    def step(self, closure=None, **amp):
        """See the class docstring. A step that torch's GradScaler makes is refused (before
        anything changes): the engine cannot see that scaler's scale, so every gradient
        would be applied multiplied by it."""
        unexpected = sorted(set(amp) - {"grad_scaler"})
        if unexpected:
            raise TypeError(f"step() got an unexpected keyword argument {unexpected[0]!r}")
        if "grad_scaler" in amp or hasattr(self, "found_inf"):
            for name in ("found_inf", "grad_scale"):  # GradScaler removes them only on success
                if hasattr(self, name):
                    delattr(self, name)
            raise errors.InvalidArgumentError(
                "zerort.torch: optimizer.step() was made by torch's GradScaler "
                "(scaler.step(optimizer); torch.cuda.amp, ShardedGradScaler), whose loss scale "
                "the engine cannot see: every gradient would be applied multiplied by it. "
                "The engine scales the loss itself: for fp16 enable the config's \"fp16\" "
                "(DeepSpeed's dynamic loss scaling; engine.backward(loss)), for bf16 no scaler "
                "is needed; drop scaler.scale(), unscale_(), step() and update() from the "
                "loop. Nothing was stepped (the micro-batch's gradients, scaled, are still "
                "held: zero_grad() drops them)", errors.InvalidArgumentError.status)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        engine = self._engine
        if self._from_engine or engine._end_micro_batch():
            engine._optimizer_step()
        return loss

    def state_dict(self):
        """See the class docstring (the param groups only; warns once)."""
        self._warn_no_moments("state_dict()")
        return super().state_dict()

    def load_state_dict(self, state_dict):
        """See the class docstring (the param groups only; warns once)."""
        for index, group in enumerate(state_dict.get("param_groups", ())):
            _config.refuse_step_changing_options(
                group, f"the state dict's param group {index} (load_state_dict; nothing loaded)",
                self._adamw)
        self._warn_no_moments("load_state_dict()")
        super().load_state_dict(state_dict)

    def _warn_no_moments(self, call):
        if self._warned_no_moments:
            return
        self._warned_no_moments = True
        warnings.warn(
            f"zerort.torch: engine.optimizer.{call} holds the param groups' hyperparameters "
            "only: the optimizer's moments and fp32 master weights are sharded in the engine, "
            "so a resume from this state dict alone restarts them (another trajectory). Save "
            "and resume with engine.save_checkpoint(dir) / engine.load_checkpoint(dir) "
            "(every rank calls them), which hold everything.", UserWarning, stacklevel=3)

    def zero_grad(self, set_to_none=True):
        """See the class docstring."""
        del set_to_none  # always None: the engine holds the gradients
        self._engine._drop_unstepped_gradients()
        for group in self.param_groups:
            for param in group["params"]:
                param.grad = None

    def push(self):
        """Pushes the param groups' values that differ from the engine's (between steps)."""
        self._check_groups()
        for index, group in enumerate(self.param_groups):
            _config.refuse_step_changing_options(group, f"engine.optimizer.param_groups[{index}]",
                                                 self._adamw)
            fields = _engine_fields(group, self._keys)
            known = self._known[index]
            if all(known[name] == value for name, value in fields.items()):
                continue
            try:
                self._engine.engine.set_group_hyper(index, fields)
            except errors.InvalidArgumentError as error:
                raise errors.InvalidArgumentError(
                    f"zerort.torch: engine.optimizer.param_groups[{index}] holds a value the "
                    f"engine refuses ({error.message}). Nothing was stepped: put the value "
                    "right and call step() again, or zero_grad() to drop this step's "
                    "gradients. (An lr schedule run past its last step can turn negative.)",
                    error.status) from None
            self._known[index] = self._engine.engine.group_hyper(index)

    def pull(self):
        """Reads the engine's values into the param groups where the engine changed them (a
        config scheduler's lr after a step, every value after load_checkpoint)."""
        self._check_groups()
        core_engine = self._engine.engine
        for index, group in enumerate(self.param_groups):
            hyper = core_engine.group_hyper(index)
            self._known[index] = hyper
            current = _engine_fields(group, self._keys)
            for key, value in _torch_values(hyper, self._keys).items():
                if key == "betas":
                    differs = (current["beta1"], current["beta2"]) != value
                else:
                    differs = current[key] != value
                if differs:
                    group[key] = readable(value)

    def _check_groups(self):
        if len(self.param_groups) != len(self._known):
            raise errors.FailedPreconditionError(
                f"zerort.torch: engine.optimizer has {len(self.param_groups)} param groups "
                f"but the engine has {len(self._known)}; the groups are fixed at initialize()")
