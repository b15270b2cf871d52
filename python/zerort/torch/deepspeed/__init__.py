"""deepspeed.initialize's signature and return value over ZeroRT, so that a DeepSpeed training
script switches by its import:

    from zerort.torch import deepspeed          # was: import deepspeed
    engine, optimizer, loader, scheduler = deepspeed.initialize(
        args=args, model=model, model_parameters=params, training_data=dataset,
        config="ds_config.json")

What DeepSpeed takes, ZeroRT takes the same way:
- the config from `config`, `config_params` or `args.deepspeed_config` (one of them);
- `optimizer`: None (the config's), a torch.optim.AdamW, Adam or SGD the script built (its
  type, param groups and their hyperparameters become the engine's: Hugging Face's Trainer
  passes its own when the config has no optimizer), or a callable that builds one from the
  params; the returned optimizer is always the engine's (engine.optimizer);
- `lr_scheduler`: None (the config's, if any), a callable that builds one from the engine's
  optimizer (Hugging Face's Trainer passes one), or a scheduler the script built on the
  optimizer it passes (it then drives the engine's optimizer, which took over that
  optimizer's groups); as DeepSpeed's, the engine steps it after each optimizer step it
  applies and saves it in checkpoints (TorchEngine.drive_lr_scheduler), so the script does
  not step it; a scheduler built on any other optimizer is refused, naming the way;
- `training_data`: a torch Dataset, returned as a DataLoader of the config's
  train_micro_batch_size_per_gpu over this rank's share (a DistributedSampler, as DeepSpeed's
  loader), with `collate_fn`;
- `dist_init_required`: as DeepSpeed's, None or True sets torch.distributed's default group
  up over the engine's ranks when it is not (init_distributed()), for the script's own
  torch.distributed and deepspeed.comm calls; False leaves it. `mpu` (model parallelism) is
  not supported.
`comm`, which DeepSpeed has not, picks the ranks as in zerort.torch.initialize (None: the
launcher's: torch.distributed's under torchrun, else this process's MPI rank); with a
communicator given, torch.distributed is left alone (its ranks may be threads of one process).

`deepspeed.init_distributed()` sets torch.distributed's default group up over the same
ranks on its own (_torch_distributed.py), and `deepspeed.comm` (comm.py) is DeepSpeed's comm
module over torch.distributed.

The script's other DeepSpeed calls keep their names: `deepspeed.zero.Init` (init_context;
`comm` as initialize's), `deepspeed.zero.GatheredParameters`
and `deepspeed.zero.register_external_parameter` (zerort.torch.gathered and
register_external_parameter), `deepspeed.utils.set_z3_leaf_modules` and its kin, and
`deepspeed.utils.safe_get_full_fp32_param`, `safe_get_full_optimizer_state`,
`safe_get_full_grad`, `safe_set_full_fp32_param` and `safe_set_full_optimizer_state`
(_full_state.py), and `deepspeed.utils.zero_to_fp32`'s
get_fp32_state_dict_from_zero_checkpoint, convert_zero_checkpoint_to_fp32_state_dict and
load_state_dict_from_zero_checkpoint (_consolidated.py). `zero` and `utils` are modules of
this package, so imports keep their shape too:
`from zerort.torch.deepspeed.zero import GatheredParameters`.
"""
import torch

from ... import core, errors
from .._config import TORCH_OPTIONS
from .._engine import TorchEngine
from .._torch_communicator import default_communicator
from .._torch_distributed import init_torch_distributed
from . import utils, zero
from .comm import init_distributed

__all__ = ["add_config_arguments", "comm", "init_distributed", "initialize", "utils", "zero"]

# The client optimizers ZeroRT steps itself: the class, ZeroRT's type, DeepSpeed's type with
# the params that make it that optimizer, and the group keys that carry over.
_ADAM_KEYS = ("lr", "betas", "eps", "weight_decay")
_SGD_KEYS = ("lr", "momentum", "dampening", "weight_decay", "nesterov")
_CLIENT_OPTIMIZERS = (  # AdamW first: newer PyTorch makes it a subclass of Adam
    (torch.optim.AdamW, "adamw", "AdamW", {}, _ADAM_KEYS),
    (torch.optim.Adam, "adam", "Adam", {"adam_w_mode": False}, _ADAM_KEYS),
    (torch.optim.SGD, "sgd", "SGD", {}, _SGD_KEYS),
)


def add_config_arguments(parser):
    """deepspeed.add_config_arguments: adds DeepSpeed's command-line arguments to an
    argparse parser (--deepspeed, --deepspeed_config, and the deprecated --deepscale,
    --deepscale_config) and returns it; initialize(args=args) reads args.deepspeed_config
    (or args.deepscale_config)."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument("--deepspeed", default=False, action="store_true",
                       help="Enable DeepSpeed (helper flag for user code, no impact on DeepSpeed "
                            "backend)")
    group.add_argument("--deepspeed_config", default=None, type=str,
                       help="DeepSpeed json configuration file.")
    group.add_argument("--deepscale", default=False, action="store_true",
                       help="Deprecated enable DeepSpeed (helper flag for user code, no impact "
                            "on DeepSpeed backend)")
    group.add_argument("--deepscale_config", default=None, type=str,
                       help="Deprecated DeepSpeed json configuration file.")
    return parser


def initialize(args=None, model=None, optimizer=None, model_parameters=None,
               training_data=None, lr_scheduler=None, mpu=None, dist_init_required=None,
               collate_fn=None, config=None, config_params=None, comm=None):
    """(engine, engine.optimizer, a DataLoader of `training_data` or None, the lr scheduler or
    None), as deepspeed.initialize returns them; see the module's comment for each argument.
    """
    if model is None:
        raise errors.InvalidArgumentError("zerort.torch.deepspeed.initialize: model is required")
    if mpu is not None:
        raise errors.UnimplementedError(
            "zerort.torch.deepspeed.initialize: mpu (model parallelism) is not supported: "
            "ZeroRT's ranks are data-parallel only", errors.UnimplementedError.status)
    raw = core.config_dict(_one_config(args, config, config_params))
    if not isinstance(raw, dict):
        raise errors.InvalidArgumentError(
            f"zerort.torch: the config must be a JSON object, not {type(raw).__name__}")
    client = None  # the script's own optimizer, whose groups become the engine's
    if optimizer is not None:
        if "optimizer" in raw:
            raise errors.InvalidArgumentError(
                "zerort.torch.deepspeed.initialize: both the config's \"optimizer\" and an "
                "optimizer argument were given; keep one of them")
        if not isinstance(optimizer, torch.optim.Optimizer):
            params = (model_parameters if model_parameters is not None
                      else [p for p in model.parameters() if p.requires_grad])
            optimizer = optimizer(params)
        client = optimizer
        raw, model_parameters = _with_client_optimizer(raw, optimizer)
    if lr_scheduler is not None:
        if "scheduler" in raw:
            raise errors.InvalidArgumentError(
                "zerort.torch.deepspeed.initialize: both the config's \"scheduler\" and an "
                "lr_scheduler argument were given; keep one of them")
        built = hasattr(lr_scheduler, "optimizer") and hasattr(lr_scheduler, "step")
        if built and (client is None or lr_scheduler.optimizer is not client
                      or any(not g["params"] for g in client.param_groups)):
            raise errors.InvalidArgumentError(
                "zerort.torch.deepspeed.initialize: lr_scheduler is a scheduler built on "
                + ("another optimizer than the optimizer argument" if client is None
                   or lr_scheduler.optimizer is not client else
                   "an optimizer with an empty param group, which the engine drops")
                + ", so it cannot drive the engine's: pass a callable that builds it from an "
                "optimizer (lambda optimizer: get_linear_schedule_with_warmup(optimizer, ...)), "
                "or build it on the returned optimizer and hand it over with "
                "engine.drive_lr_scheduler(scheduler)")
        if not built and not callable(lr_scheduler):
            raise errors.InvalidArgumentError(
                "zerort.torch.deepspeed.initialize: lr_scheduler must be a callable that "
                f"builds a scheduler from an optimizer, not a {type(lr_scheduler).__name__}")
    if comm is None:
        comm = default_communicator(raw)
        if dist_init_required is not False and torch.distributed.is_available():
            init_torch_distributed(comm, port=0)  # DeepSpeed's default: for the script's calls
    engine = TorchEngine(model, raw, comm, model_parameters=model_parameters)
    if lr_scheduler is not None and hasattr(lr_scheduler, "optimizer"):
        engine.drive_lr_scheduler(_rebound(lr_scheduler, engine.optimizer))
    elif lr_scheduler is not None:
        engine.drive_lr_scheduler(lr_scheduler(engine.optimizer))
    loader = None
    if training_data is not None:
        loader = _data_loader(engine, training_data, collate_fn, raw)
    return engine, engine.optimizer, loader, engine.lr_scheduler


def _one_config(args, config, config_params):
    """The config given once, by `config`, `config_params` or `args.deepspeed_config`."""
    from_args = None
    if args is not None:  # DeepSpeed reads the deprecated --deepscale_config where it is set
        from_args = getattr(args, "deepspeed_config", None) or getattr(args, "deepscale_config",
                                                                       None)
    given = [(name, value) for name, value in (("config", config),
                                                ("config_params", config_params),
                                                ("args.deepspeed_config", from_args))
             if value is not None]
    if not given:
        raise errors.InvalidArgumentError(
            "zerort.torch.deepspeed.initialize: no config: pass config= (a dict, JSON text or "
            "a .json path), config_params=, or args with deepspeed_config")
    if len(given) > 1:
        raise errors.InvalidArgumentError(
            "zerort.torch.deepspeed.initialize: the config is given twice ("
            + " and ".join(name for name, _ in given) + "); keep one")
    return given[0][1]


def _with_client_optimizer(raw, optimizer):
    """(`raw` with an optimizer section for the torch optimizer `optimizer`, its param
    groups as model_parameters)."""
    for cls, zerort_type, deepspeed_type, extra, keys in _CLIENT_OPTIMIZERS:
        if isinstance(optimizer, cls):
            break
    else:
        raise errors.UnimplementedError(
            f"zerort.torch.deepspeed.initialize: the optimizer argument is a "
            f"{type(optimizer).__name__}; ZeroRT steps torch.optim.AdamW, Adam and SGD itself "
            "(or name one of its optimizers in the config's \"optimizer\": AdamW, Adam, SGD, "
            "Lion, Lamb)", errors.UnimplementedError.status)
    decoupled = {bool(group.get("decoupled_weight_decay")) for group in optimizer.param_groups}
    if len(decoupled) > 1:
        raise errors.UnimplementedError(
            "zerort.torch.deepspeed.initialize: the Adam's groups mix decoupled_weight_decay "
            "True and False; ZeroRT steps one optimizer type for every group",
            errors.UnimplementedError.status)
    groups = []
    for index, group in enumerate(optimizer.param_groups):
        for option in ("amsgrad", "maximize"):
            if group.get(option):
                raise errors.UnimplementedError(
                    f"zerort.torch.deepspeed.initialize: the {type(optimizer).__name__}'s group "
                    f"{index} sets {option}=True, which ZeroRT's {zerort_type} does not do",
                    errors.UnimplementedError.status)
        if group.get("decoupled_weight_decay"):  # Adam(decoupled_weight_decay=True) is AdamW
            zerort_type, deepspeed_type, extra = "adamw", "AdamW", {}
        if group["params"]:  # as DeepSpeed, empty groups are dropped; the trainer's own
            # keys ("name") stay in the engine's param_groups
            groups.append({key: value if key == "params" else _plain(value)
                           for key, value in group.items() if key not in TORCH_OPTIONS})
    hyper = {key: groups[0][key] for key in keys if key in groups[0]} if groups else {}
    if not core.is_deepspeed_config(raw):
        section = dict(hyper, type=zerort_type)
    else:
        section = {"type": deepspeed_type, "params": dict(hyper, **extra)}
    return dict(raw, optimizer=section), groups


def _rebound(scheduler, optimizer):
    """`scheduler`, built on the script's optimizer (whose groups `optimizer`, the engine's,
    took over one for one, with their lr and initial_lr), now driving `optimizer`; a chained
    scheduler's parts too. `optimizer.step` gets the step counter PyTorch's schedulers put
    on the optimizer they are built on (a throwaway scheduler puts it there; the groups'
    lrs are kept)."""
    lrs = [group["lr"] for group in optimizer.param_groups]
    torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    for group, lr in zip(optimizer.param_groups, lrs):
        group["lr"] = lr
    for part in [scheduler] + list(getattr(scheduler, "_schedulers", [])):
        part.optimizer = optimizer
    return scheduler


def _plain(value):
    """A group value as JSON holds it (a tensor lr as its number, betas as a list)."""
    if isinstance(value, torch.Tensor):
        return value.item()
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def _data_loader(engine, dataset, collate_fn, raw):
    """DeepSpeed's loader: this rank's share of `dataset` (a DistributedSampler over the
    engine's ranks) in batches of train_micro_batch_size_per_gpu."""
    micro = engine.train_micro_batch_size_per_gpu()
    if not micro:
        raise errors.InvalidArgumentError(
            "zerort.torch.deepspeed.initialize: training_data needs the batch size: set "
            "train_micro_batch_size_per_gpu (or train_batch_size) in the config")
    sampler = torch.utils.data.distributed.DistributedSampler(
        dataset, num_replicas=engine.world_size, rank=engine.rank)
    return torch.utils.data.DataLoader(dataset, batch_size=micro, sampler=sampler,
                                       collate_fn=collate_fn,
                                       drop_last=bool(raw.get("dataloader_drop_last", False)))
