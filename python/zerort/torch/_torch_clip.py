"""torch.nn.utils.clip_grad_norm_ on an engine's params clips through the engine.

The hooks hand every gradient to the engine and clear `.grad` (_engine.py), so PyTorch's own
clip_grad_norm_ over the model would find no gradient, return 0 and clip nothing: a script
ported from plain PyTorch, DDP or Accelerate would train unclipped without a word. Importing
zerort.torch therefore wraps torch.nn.utils.clip_grad_norm_ (and its home,
torch.nn.utils.clip_grad): for params no open engine drives, it is PyTorch's own call,
unchanged. For the params of an open engine it is engine.clip_grad_norm_(max_norm): the
total L2 norm of the gradient the next step applies (collective: every rank calls it, after
the window's last backward), and that step clipped to max_norm. The params passed must hold
every param the engine steps (model.parameters(), with or without its frozen ones): the
engine clips all of them by one norm, as a call over the whole model does. A subset, params
of two engines, the engine's params next to others that have a gradient, and max_norm 0
(PyTorch's zeroes the gradients, the engine's reads the norm) are refused naming the fix.
With error_if_nonfinite, a norm that is not finite raises after the engine read it and set
the next step's clipping (PyTorch's raises before touching anything). A name bound before
zerort.torch was imported (`from torch.nn.utils import clip_grad_norm_` first) keeps
PyTorch's call.
"""
import functools
import math

import torch

from .. import errors
from ._gathered import driver_of


def _clip_through_engines(original):
    @functools.wraps(original)
    def clip_grad_norm_(parameters, max_norm, norm_type=2.0, *args, **kwargs):
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        engines = {}
        for param in params:
            engine = driver_of(param)
            if engine is not None:
                engines.setdefault(id(engine), engine)
        if not engines:
            return original(params, max_norm, norm_type, *args, **kwargs)
        if len(engines) > 1:
            raise errors.InvalidArgumentError(
                "torch.nn.utils.clip_grad_norm_: the params belong to several ZeroRT engines; "
                "call each engine's clip_grad_norm_(max_norm)", errors.InvalidArgumentError.status)
        engine = next(iter(engines.values()))
        if float(max_norm) == 0.0:
            raise errors.InvalidArgumentError(
                "torch.nn.utils.clip_grad_norm_(..., max_norm=0) zeroes every gradient in "
                "PyTorch, while the ZeroRT engine's 0 means no clipping: pass float('inf') to "
                "read the norm without clipping, or a max_norm > 0",
                errors.InvalidArgumentError.status)
        _check_covers_the_engine(engine, params)
        norm = engine.clip_grad_norm_(max_norm, norm_type)
        error_if_nonfinite = kwargs.get("error_if_nonfinite", args[0] if args else False)
        if error_if_nonfinite and not math.isfinite(norm.item()):
            raise RuntimeError(
                f"The total norm of order {float(norm_type)} for gradients from `parameters` is "
                "non-finite, so it cannot be clipped. To disable this error and scale the "
                "gradients by the non-finite norm anyway, set `error_if_nonfinite=False`")
        return norm

    clip_grad_norm_.zerort_wrapped = original
    return clip_grad_norm_


def _check_covers_the_engine(engine, params):
    """The engine clips every param it steps together: `params` must hold all of them, and
    nothing else with a gradient."""
    given = {id(p) for p in params}
    stepped = engine._params  # (name, param, id) of every param the engine steps
    missing = [name for name, param, _ in stepped if id(param) not in given]
    if missing:
        raise errors.InvalidArgumentError(
            f"torch.nn.utils.clip_grad_norm_: {len(missing)} of the {len(stepped)} params the "
            f"ZeroRT engine steps are not among those passed (first: {missing[0]}); the engine "
            "clips all of its params by one total norm: pass model.parameters(), or call "
            "engine.clip_grad_norm_(max_norm)", errors.InvalidArgumentError.status)
    others = [p for p in params if driver_of(p) is None and p.grad is not None]
    if others:
        raise errors.InvalidArgumentError(
            f"torch.nn.utils.clip_grad_norm_: {len(others)} param(s) passed with the ZeroRT "
            f"engine's have a .grad of their own (first of shape {tuple(others[0].shape)}); "
            "the engine's gradients are clipped by the engine alone: call "
            "engine.clip_grad_norm_(max_norm) for its params and clip_grad_norm_ for the others",
            errors.InvalidArgumentError.status)


def install():
    """Wraps torch.nn.utils.clip_grad_norm_ (once, however often zerort.torch is imported)."""
    from torch.nn.utils import clip_grad
    if getattr(clip_grad.clip_grad_norm_, "zerort_wrapped", None) is not None:
        return
    wrapped = _clip_through_engines(clip_grad.clip_grad_norm_)
    clip_grad.clip_grad_norm_ = wrapped
    torch.nn.utils.clip_grad_norm_ = wrapped
