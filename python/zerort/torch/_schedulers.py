"""engine.lr_scheduler: the config's built-in schedule, as DeepSpeed's engine.lr_scheduler.

The config's "scheduler" ({"type": "WarmupLR" | "WarmupDecayLR" | "WarmupCosineLR",
"params": {...}}, DeepSpeed's names and formulas) runs inside the library: the engine sets
every group's lr before each optimizer step and advances the schedule after each applied
(not skipped) step; its position is saved in checkpoints and restored by load_checkpoint.
This object reads that schedule; it does not drive it.
"""
from .. import errors
from ._optimizer import readable


class EngineLRScheduler:
    """The engine's schedule, read from the engine (see the module's docstring).

    `type` and `params` are the config's; `last_batch_iteration` is DeepSpeed's position
    (-1 before the first applied step). get_lr() and get_last_lr() give each group's lr for
    the next step (as DeepSpeed's, whose step() has already put it in the optimizer).
    """

    def __init__(self, engine, config):
        """`engine`: the TorchEngine; `config`: its normalized config."""
        self._engine = engine
        scheduler = config.get("scheduler", {})
        self.type = scheduler.get("type")
        self.params = dict(scheduler.get("params", {}))

    @property
    def last_batch_iteration(self):
        """Optimizer steps applied so far minus one (DeepSpeed's last_batch_iteration)."""
        return self._engine.engine.lr_schedule_iteration

    def get_lr(self):
        """Each group's lr for the next optimizer step."""
        core_engine = self._engine.engine
        return [readable(core_engine.lr(group)) for group in range(core_engine.num_groups)]

    def get_last_lr(self):
        """Each group's lr as the schedule last set it: the lr for the next step."""
        return self.get_lr()

    def step(self, *args, **kwargs):
        """Does nothing: the engine advances the schedule after every applied optimizer step
        (as DeepSpeed's engine steps its lr_scheduler), so a loop that also calls
        lr_scheduler.step() is not stepped twice."""
        del args, kwargs

    def state_dict(self):
        """The schedule's position: {"last_batch_iteration": n}."""
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, state):
        """Checks `state` against the engine's position, which engine.load_checkpoint
        restores with the rest of the checkpoint (the library moves the schedule only by
        stepping or by loading a checkpoint): FailedPreconditionError if they differ."""
        wanted = int(state["last_batch_iteration"])
        if wanted != self.last_batch_iteration:
            raise errors.FailedPreconditionError(
                f"zerort.torch: the schedule is at last_batch_iteration "
                f"{self.last_batch_iteration}, the state given is at {wanted}; the engine's "
                "schedule position is restored by engine.load_checkpoint(dir), which saved "
                "it with the checkpoint")

    def __repr__(self):
        return (f"EngineLRScheduler(type={self.type!r}, "
                f"last_batch_iteration={self.last_batch_iteration})")
