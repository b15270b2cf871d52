"""Telling a whole second backward in one micro-batch from a duplicate inside one backward.

Both reach the engine as a param's second gradient in a micro-batch (DuplicateGradientError),
but their fixes differ:
- a second `loss.backward()` before `engine.step()` (PyTorch's accumulation habit): call
  engine.step() after each micro-batch's backward, or use engine.no_sync();
- a second gradient inside one backward (reentrant checkpointing recomputing a shared
  weight, a weight used twice): the library's own message names the causes and the
  guard.on_duplicate policy.

BackwardPasses numbers the backward passes of a micro-batch. A pass begins at the gradient
of the model's output (a hook put on every output of the root module's forward), or, when
that did not run, at the first param gradient outside any pass; it ends when autograd
finishes the graph task it began in (Variable._execution_engine.queue_callback). Reentrant
checkpointing's nested backward runs inside the outer pass, which began at the output's
gradient, so a duplicate there stays "inside one backward".

An error of the engine inside a gradient hook is raised when the pass ends (from that same
callback), not in the hook: a hook that raises leaves autograd's remaining work for that
backward queued on the thread (PyTorch 1.13), and on the main thread the params that work
holds are freed only after the interpreter has shut down, which hangs the process at exit.
Once an error is pending, the pass's remaining gradients are dropped.
"""
from torch.autograd import Variable

from .. import errors

UNUSED_HINT = (
    "\nIn PyTorch the causes are: a module or branch the forward did not run on this rank "
    "(set guard.on_unused = \"zero\"; DeepSpeed: zero_optimization.ignore_unused_parameters "
    "= true, DDP: find_unused_parameters=True); a param the model never uses (freeze it, "
    "requires_grad_(False), before initialize()); or torch.utils.checkpoint.checkpoint(..., "
    "use_reentrant=True) around a block whose inputs do not require grad (frozen embeddings, "
    "the LoRA case), which computes no gradient for any param inside the block, silently: "
    "pass use_reentrant=False, or make the block's input require grad (x.requires_grad_()).")


NO_BACKWARD_AT_STAGE3_HINT = (
    "\nThis rank's step() came after a forward whose backward did not run through the "
    "model's outputs (a loss that does not depend on them: a rank with no targets in its "
    "batch), while its peers' backwards gather each module's params: at stage 3 every rank "
    "runs the backward through the model. Make such a rank's loss depend on the outputs "
    "(loss = outputs.sum() * 0), which trains nothing and makes the same gathers.")


INTERRUPTED_HINT = (
    "\nA backward on this rank raised before it finished (an exception from loss.backward() "
    "that the trainer caught and went on from): autograd stopped with only part of the "
    "gradients handed over, so this micro-batch's gradients are incomplete. Let the "
    "exception end the job (every rank's), or, to skip a bad batch, skip it on every rank "
    "and drop what it left with optimizer.zero_grad() there.")


def step_without_backward_error(after_zero_grad=False):
    """The error for a step() that follows another with no forward or gradient between
    (`after_zero_grad`: optimizer.zero_grad() dropped that micro-batch's gradients)."""
    if after_zero_grad:
        return errors.FailedPreconditionError(
            "zerort.torch: step() was called after optimizer.zero_grad() dropped this "
            "micro-batch's gradients (a zero_grad() between backward and step() discards "
            "them, as in PyTorch, and ends the micro-batch): nothing is left to step. Call "
            "zero_grad() after step() or before the backward, or leave out this step() when "
            "the batch was meant to be rejected.", errors.FailedPreconditionError.status)
    return errors.FailedPreconditionError(
        "zerort.torch: step() was called with no forward and no gradient since the last "
        "step() (or optimizer.step()): nothing of this micro-batch reached the engine. "
        "engine.step() already ends the micro-batch and steps the optimizer every "
        "gradient_accumulation_steps calls, so a loop calls either engine.step() (DeepSpeed "
        "style) or engine.optimizer.step() (PyTorch style) once per backward, not both: drop "
        "the optimizer.step() after engine.step().", errors.FailedPreconditionError.status)


def forward_without_backward_error():
    """The error for a step() after a forward whose backward never ran (no gradient)."""
    return errors.FailedPreconditionError(
        "zerort.torch: step() was called after a forward, but no backward has run through "
        "the model's outputs since the last step(): call engine.backward(loss) or "
        "loss.backward() before step(). An evaluation forward needs no step(): run it under "
        "torch.no_grad().", errors.FailedPreconditionError.status)


def frozen_after_initialize_hint(names):
    """What to add to UnusedParametersError when `names` (registered trainable) were frozen
    since initialize()."""
    listed = ", ".join(f'"{name}"' for name in names[:5]) + (", ..." if len(names) > 5 else "")
    return (f"\n{len(names)} of them ({listed}) were frozen after initialize() "
            "(requires_grad_(False)): the engine registered them as trainable and expects "
            "their gradients. To freeze params during training, set guard.on_unused = \"zero\" "
            "(DeepSpeed: \"ignore_unused_parameters\": true), which leaves a param that no rank "
            "computed a gradient for unchanged by the step; or close() the engine and "
            "initialize() again with them frozen.")


def second_backward_error(name, first_pass, this_pass, accumulation_steps):
    """The DuplicateGradientError for a param whose gradient came again from a later
    backward pass of the same micro-batch."""
    return errors.DuplicateGradientError(
        f"zerort.torch: param \"{name}\" got a gradient from backward pass {this_pass} of "
        f"this micro-batch after one from pass {first_pass}: a second backward (e.g. another "
        "loss.backward()) ran before engine.step(). Each backward is one micro-batch. Fix: "
        "call engine.step() after every micro-batch's backward (it steps the optimizer only "
        f"every gradient_accumulation_steps = {accumulation_steps} micro-batches; set that "
        "in the config to accumulate, and use engine.backward(loss), which divides the loss "
        "by it), or run the backwards before the last one inside `with engine.no_sync():` "
        "(each backward is then a micro-batch of the step, so gradient_accumulation_steps "
        f"must count all of them: it is {accumulation_steps}, and no_sync() refuses a "
        "micro-batch past it); several losses of one forward: one backward of their sum. "
        "A backward that must not train this model's params at all (a GAN's generator "
        "loss through its discriminator) hands them gradients all the same: call "
        "optimizer.zero_grad() before their own backward (it drops gradients no step() "
        "followed), or freeze them for that backward (requires_grad_(False), then True "
        "again), which also saves the work.",
        errors.DuplicateGradientError.status)


class BackwardPasses:
    """The backward passes of the current micro-batch (see the module's docstring)."""

    def __init__(self):
        self.current = 0  # passes begun in this micro-batch
        self._open = False
        self._first = {}  # param id -> the pass its first gradient came from
        self._error = None  # raised when the pass ends
        self.on_end = []  # callables run when a pass ends (before a pending error is raised)

    def begin(self):
        """A gradient is being computed: starts a pass unless one is running."""
        if self._open:
            return
        self.current += 1
        self._open = True
        try:
            Variable._execution_engine.queue_callback(self._end)
        except RuntimeError:  # not inside autograd's engine: no end to wait for
            self._open = False

    def _end(self):
        failed = None
        for callback in self.on_end:  # still inside the pass: their errors wait
            try:
                callback()
            except BaseException as error:  # noqa: B036 - every callback runs; raised below
                failed = failed or error
        self._open = False
        error, self._error = self._error, None
        if error is None:
            error = failed
        elif failed is not None:
            error.__context__ = failed
        if error is not None:
            raise error

    @property
    def open(self):
        """Whether a pass is running (its end will come). Outside autograd's engine: a pass
        whose backward raised, so its end never came."""
        return self._open

    @property
    def failed(self):
        """Whether an error waits for the end of the pass (drop further gradients)."""
        return self._error is not None

    def fail(self, error):
        """Raises `error` when the pass ends (at once when no pass is running); an error
        already pending wins."""
        if not self._open:
            raise error
        if self._error is None:
            self._error = error

    def raise_pending(self):
        """Raises the pending error, if any (once)."""
        error, self._error = self._error, None
        if error is not None:
            raise error

    def arrived(self, pid):
        """Param `pid`'s gradient was handed over in the current pass."""
        self._first.setdefault(pid, self.current)

    def first_pass(self, pid):
        """The pass that gave `pid` its first gradient in this micro-batch (None: none)."""
        return self._first.get(pid)

    def abandon(self):
        """The micro-batch is dropped after a backward that raised: its pass, its pending
        error and its arrivals are forgotten."""
        self._error = None
        self.reset()

    def reset(self):
        """The micro-batch ended (raises an error still pending)."""
        self.current = 0
        self._open = False
        self._first.clear()
        self.raise_pending()
