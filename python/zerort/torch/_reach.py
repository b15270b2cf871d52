"""guard.on_unused = "zero": params that will get no gradient are marked ready early.

A bucket is reduced once every param in it has handed over its gradient. Under
on_unused = "zero" a param that gets none (an idle expert of a mixture of experts, a branch
this rank skipped) completes only at end_backward, so every bucket holding one waits, with
its gradient buffer, until backward ends; with many such buckets the pool of buffers
(buckets.pool_buffers) runs short mid-backward and grows (buckets.grow_pool) toward one
buffer per bucket. As DDP's
find_unused_parameters: when a root forward ends, the autograd graph of its outputs is
walked to the AccumulateGrad nodes it reaches; a registered param that no forward of the
micro-batch reached is marked absent (zero_grad_absent: it contributes zeros)
as soon as backward comes to it, that is when the gradient of a param registered before it
arrives. (Buckets are laid out and launched in reverse registration order: marking every
unreached param at once would make the buckets late in that order take buffers and wait
for the earlier ones.) So buckets never wait for a gradient that will not come; what is
left when backward ends is completed by end_backward, as before. Only under
guard.on_unused = "zero".

What this changes, and its limits:
- A param marked this way does not count as used: one that no rank used in a step is left
  untouched by it (no weight decay, no momentum, its step count kept), as before.
- A param used outside the model's forward (in the loss, a regularizer on model.head.weight)
  is not reached by the outputs' graph: its gradient then comes after it was marked, which
  is an error naming it (as DDP's "marked ready twice"); use it inside forward, or keep
  guard.on_unused = "error".
- A custom autograd.Function in the graph (reentrant activation checkpointing,
  torch.utils.checkpoint(..., use_reentrant=True)) may compute gradients for params that it
  does not take as inputs; the graph then tells nothing, and no param is marked early in
  that micro-batch (the previous behaviour: completed at end_backward).

At stage 3 the params of a unit used by a forward of the micro-batch are marked instead as
that module's backward begins (the gradient hook on its outputs, _stage3.py), at the same
point on every rank: ranks that reach different params of a module (a branch taken per
sample, a mixture of experts) would otherwise complete its bucket at different points of
their backward, before or after another unit's gather, and the collectives would not match.
Units no forward used (an idle expert) are swept as at stages 0-2. A unit used by a forward
whose outputs the loss does not use completes at end_backward. A unit all of whose params are
marked there is released to the engine there, but its params keep viewing their storage
until the backward pass ends (_stage3.py; later if the engine has gathered it again): the
module's backward has not run yet and may read them (a param read detached, or frozen since
initialize()).
Limit: where a module's backward gathers another unit (a frozen child, a module it calls)
and some ranks do not reach the module's own params, a rank that reaches them completes the
bucket when their gradient arrives, after that gather or before it, as the graph has it:
the collectives may not match (the error's note says to make the module a leaf with what
it calls, which gathers them together).
"""
from torch.autograd.function import BackwardCFunction

from .. import errors


class Reach:
    """The params reached by the graphs of a micro-batch's root forwards (by id)."""

    def __init__(self):
        self._reached = set()
        self._forwards = 0
        self._opaque = False

    def add(self, outputs):
        """Records what the graph of `outputs` (tensors that require grad) reaches."""
        self._forwards += 1
        seen, stack = set(), []
        for tensor in outputs:
            if tensor.grad_fn is None:  # a leaf returned as it is
                self._reached.add(id(tensor))
            else:
                stack.append(tensor.grad_fn)
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            variable = getattr(node, "variable", None)  # AccumulateGrad
            if variable is not None:
                self._reached.add(id(variable))
                continue
            if isinstance(node, BackwardCFunction):
                self._opaque = True
            for next_node, _ in node.next_functions:
                if next_node is not None:
                    stack.append(next_node)

    def ready(self):
        """Whether unreached params can be marked: a forward recorded a graph, and no
        graph hides what it uses."""
        return self._forwards > 0 and not self._opaque

    def reaches(self, param):
        """Whether a recorded graph reaches `param`."""
        return id(param) in self._reached


class UnusedMarking:
    """Marks the unreached params of one engine's micro-batch ready without a gradient.

    `params`: [(name, param, id)] in registration order; `mark_absent(param, id)`: marks
    one (unless its gradient was handed over: then False); `failed()`: whether the
    backward pass has failed (no more marking in it)."""

    def __init__(self, params, mark_absent, failed):
        self._params = params
        self._mark_absent = mark_absent
        self._failed = failed
        self.marked = set()  # ids marked ready without a gradient in this micro-batch
        self._at_backward = set()  # ids marked by their module's backward (mark()), not swept
        self._reach = Reach()
        self._sweep = len(params)  # params from here on were considered for marking

    def forward_ended(self, outputs):
        """A root forward of the micro-batch ended with `outputs` (tensors that need a
        gradient)."""
        self._reach.add(outputs)

    def at_backward(self, members):
        """The params `members` [(param, id)] will be marked by mark(), as the backward of a
        module whose forward used them begins, not by sweep()."""
        self._at_backward.update(pid for _, pid in members)

    def sweep(self, position):
        """The gradient of the param at `position` arrives: marks the params after it that
        no output reaches (but those at_backward() named). Buckets are laid out, and
        launched, in reverse registration order, so each is marked when backward has come
        to it, not all at once (their buffers would wait for earlier buckets)."""
        if not self._reach.ready():
            return
        while self._sweep - 1 > position:
            self._sweep -= 1
            _, param, pid = self._params[self._sweep]
            if pid not in self._at_backward:
                self._mark(param, pid)
            if self._failed():
                return

    def mark(self, members):
        """Marks the params `members` [(param, id)] that no output reaches (a stage-3
        module's units, as its backward begins)."""
        if not self._reach.ready():
            return
        for param, pid in members:
            self._mark(param, pid)
            if self._failed():
                return

    def _mark(self, param, pid):
        if not self._reach.reaches(param) and pid not in self.marked and self._mark_absent(
                param, pid):
            self.marked.add(pid)

    def micro_batch_ended(self):
        """Starts over for the next micro-batch."""
        self._reach = Reach()
        self.marked.clear()
        self._at_backward.clear()
        self._sweep = len(self._params)


def late_gradient_error(name):
    """The error for a gradient that came for a param marked ready without one."""
    return errors.FailedPreconditionError(
        f"zerort.torch: param \"{name}\" got a gradient, but the autograd graph of the "
        "model's outputs did not reach it when forward ended, so guard.on_unused = \"zero\" "
        "had already marked it ready without one (as DDP's find_unused_parameters). It is "
        "used outside the model's forward (in the loss, a regularizer): use it inside "
        "forward, or set guard.on_unused = \"error\".",
        errors.FailedPreconditionError.status)
