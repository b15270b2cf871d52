"""Handing gradients to the engine in batches: one library call for many gradients.

One library call per param per backward is most of what handing a small param's gradient
over costs from Python (the ctypes call, its argument conversions). So the hooks queue each
checked gradient here (the tensor stays referenced until it is handed over) and the queue
goes to the engine in one core.Engine.accumulate_grads call:
- when it holds `limit` elements or more (elems_per_batch: a quarter of the smallest
  bucket, so a bucket's reduction starts at most a fraction of its fill time later than
  with one call per gradient; no limit at one rank on a GPU without gradient accumulation
  whose params' gradients are in their own dtype, where every gradient is lent until the
  step and a reduction is an identity);
- when the backward pass ends (the first of BackwardPasses.on_end);
- at stage 3, when the gradient is the last one its gathered unit waits for (the hand-over
  releases the unit, as early as one call per gradient would);
- before any other call into the engine of this micro-batch (a stage-3 gather or release, a
  param marked absent, end_backward), and at once outside a backward pass.
So the engine sees the gradients, and every other call, in the order the hooks made them.
"""

from .. import errors

# Default bucket sizes (zero/config.h's BucketConfig): first, reduce and last.
_DEFAULT_BUCKET_ELEMS = (1_000_000, 4_000_000, 1_000_000)


def elems_per_batch(config):
    """Elements queued before a hand-over for `config`, the normalized config."""
    buckets = config.get("buckets", {})
    sizes = [buckets.get(key, default) for key, default in zip(
        ("first_bucket_elems", "reduce_bucket_elems", "last_bucket_elems"),
        _DEFAULT_BUCKET_ELEMS)]
    return max(1, min(size for size in sizes if size > 0) // 4)


class Handed:
    """One gradient the queue handed over: `pid`, its tensor `grad`, whether the engine
    `kept` it (lent: it must stay unchanged until the step), and the caller's `tag`."""
    __slots__ = ("pid", "grad", "kept", "tag")

    def __init__(self, pid, grad, kept, tag):
        self.pid, self.grad, self.kept, self.tag = pid, grad, kept, tag


class GradQueue:
    """Gradients checked by the hooks and not yet handed to the engine (core.Engine)."""

    def __init__(self, engine, limit, on_device):
        """`engine`: the core.Engine; `limit`: the elements that make a batch due;
        `on_device`: the gradients are the engine's device memory (device "cuda")."""
        self._engine = engine
        self.limit = limit
        self._on_device = on_device
        # The queued params' ids, in order (empty: nothing to flush).
        self.pids, self._addresses, self._grads, self._tags = [], [], [], []
        self._elems = 0

    def __len__(self):
        return len(self.pids)

    def add(self, pid, grad, tag=None):
        """Queues param `pid`'s gradient `grad` (contiguous, the param's dtype, shape and
        device); `tag` comes back with it. True when the queue is now due for flush()."""
        self.pids.append(pid)
        self._addresses.append(grad.data_ptr())
        self._grads.append(grad)
        self._tags.append(tag)
        self._elems += grad.numel()
        return self._elems >= self.limit

    def flush(self, lend):
        """Hands every queued gradient over, in order (lent with `lend`: core.Engine.
        accumulate_grads). Returns ([Handed] for each one the engine took, None), or on a
        failure ([Handed] for the ones before it, the engine's error with a `pid`
        attribute: the failed gradient's param); the gradients after it are dropped."""
        if not self.pids:
            return [], None
        pids, grads, tags, addresses = self.pids, self._grads, self._tags, self._addresses
        self.clear()
        failure = None
        try:
            kept = self._engine.accumulate_grads(pids, addresses, self._on_device, lend)
            count = len(pids)
        except errors.ZeroError as error:
            count, kept, failure = error.handed, error.kept, error
            failure.pid = pids[count]
        handed = [Handed(pids[i], grads[i], lend and kept[i], tags[i]) for i in range(count)]
        return handed, failure

    def clear(self):
        """Drops every queued gradient."""
        self.pids, self._addresses, self._grads, self._tags = [], [], [], []
        self._elems = 0
