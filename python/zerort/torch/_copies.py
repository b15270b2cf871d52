"""A model's copies carry none of its engine: copy.deepcopy(model) (an EMA or evaluation
copy) and pickling (torch.save(model)).

The engine's module hooks are EngineHook objects, which a deep copy or a pickle replaces by
a hook that does nothing: the copy's forward runs no engine code. A stage-3 module's watched
`_parameters` (_access.py) is copied as a plain dict; a sharded param between uses holds a
NaN placeholder, so copying it is refused with the way to copy full values (inside
gathered(), the copy holds them).
"""
import copy

from .. import errors
from ._params import storage_bytes


def no_hook(*_args):
    """What an engine hook is in a copy of the model: nothing."""
    return None


class EngineHook:
    """A module hook of the engine's (`function` is called with the hook's arguments) that a
    copy of its module does not keep."""

    __slots__ = ("function",)

    def __init__(self, function):
        self.function = function

    def __call__(self, *args):
        return self.function(*args)

    def __deepcopy__(self, memo):
        return no_hook

    def __reduce__(self):
        return (_no_hook_again, ())


def _no_hook_again():
    """Unpickles an engine hook as no_hook."""
    return no_hook


def holds_values(param):
    """False for a stage-3 param between uses (a placeholder holding no values)."""
    return param.numel() <= 1 or storage_bytes(param.data) >= param.numel() * param.element_size()


def check_holds_values(parameters):
    """Refuses to copy a `_parameters` dict while one of its params holds no values."""
    for name, param in parameters.items():
        if param is not None and not holds_values(param):
            raise errors.FailedPreconditionError(
                f"copying the model: param {name!r} is sharded at stage 3 (between uses it "
                "holds a NaN placeholder, not its values); copy the model inside "
                "`with zerort.torch.gathered(list(model.parameters())):` (collective: every "
                "rank), or build the copy before initialize()")


def plain_copy(parameters, kind, memo):
    """A deep copy of a watched `_parameters` dict as a plain one of type `kind`."""
    check_holds_values(parameters)
    return kind((name, copy.deepcopy(param, memo)) for name, param in parameters.items())
