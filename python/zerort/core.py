"""The C ABI as Python objects: communicators and engines (no PyTorch needed).

Every call that fails raises the zerort exception of its status (zerort.errors) with the
library's message; nothing is returned as a code.
"""
import ctypes
import json
import math
import os
import sys
import threading
import weakref

from . import errors
from ._library import (COLLECTIVE_DESTROY_FN, COLLECTIVE_RELEASE_FN, COLLECTIVE_START_FN,
                       COLLECTIVE_TEST_FN, COLLECTIVE_WAIT_FN, GIVE_BACK_FN, LEND_FN,
                       MEMORY_CATEGORIES, Collectives, EngineCounters, GroupHyper, MemoryStats,
                       StepInfo, load)

DTYPES = {"fp32": 0, "bf16": 1, "fp16": 2}
# zero_comm_all_reduce_f32's operations.
REDUCE_OPS = {"sum": 0, "max": 1}
# zero_group_hyper's fields, as the config names them ("betas" is beta1 and beta2).
HYPER_FIELDS = ("lr", "beta1", "beta2", "eps", "weight_decay", "momentum", "dampening",
                "nesterov")

# zero_accumulate_grads's flags (zero.h).
_GRADS_ON_DEVICE = 1
_GRADS_LEND = 2

# zero_param_state (zero.h): the full fp32 values of a param zero_get_full_state copies out.
FULL_STATES = {"weights": 0, "first_moment": 1, "second_moment": 2, "grad": 3}

_lib = None
_lib_lock = threading.Lock()


def library():
    """The loaded libzerort.so (loaded once, on first use)."""
    global _lib
    lib = _lib  # every library call asks: no lock once it is loaded
    if lib is not None:
        return lib
    with _lib_lock:
        if _lib is None:
            _lib = load()
        return _lib


def _stop_lending(handle):
    """zero_lend_gathered_memory with no lender: the status (not 0: the group broke)."""
    return library().zero_lend_gathered_memory(handle, LEND_FN(), GIVE_BACK_FN(), None)


def _check(status, what):
    if status != 0:
        message = library().zero_last_error().decode(errors="replace")
        raise errors.error_for(status, f"{what}: {message}")


def version():
    """The library's version string."""
    return library().zero_version().decode()


def install_preemption_handler():
    """SIGTERM and SIGUSR1 (sent by batch schedulers before preemption) only record a
    request from now on; Engine.preemption_requested() tells every rank at once."""
    _check(library().zero_install_preemption_handler(), "zero_install_preemption_handler")


class _Handle:
    """One C object (a communicator or an engine), freed when the last reference to this
    goes: its Python owner's, and for an engine those of the tensors that view its memory
    (zerort.torch's params and anything derived from them). So a closed engine's memory
    outlives every view of it, and no view ever reads freed memory. `keep`: what must live
    until this one is freed (an engine's communicator's _Handle, an external communicator's
    table of functions)."""

    def __init__(self, value, free, keep=None):
        self.value = value
        self._free = free
        self._keep = keep

    def free(self):
        """Frees the C object now (once; later calls do nothing)."""
        lib = _lib
        if lib is not None and self.value:
            getattr(lib, self._free)(ctypes.c_void_p(self.value))
            self.value = None

    def __del__(self):
        self.free()


class Communicator:
    """One rank's communicator (owns the C handle; close() or garbage collection frees it,
    once no engine built on it still has memory that tensors view)."""

    def __init__(self, handle, backend, stream=None, keep=None):
        self._owner = None  # first: __del__ runs even if __init__ fails
        self._engines = {}
        self._owner = _Handle(handle, "zero_comm_destroy", keep)
        # "local" (threads of this process), "mpi", "nccl" or "external" (a trainer's own
        # collectives: zerort.torch.torch_communicator())
        self.backend = backend
        self.stream = stream  # nccl: the cudaStream_t (int) its collectives are ordered after
        # Open engines built on this communicator: raw handle -> (the Engine's handle box,
        # callbacks to run before the engine is closed, the engine's _Handle). A
        # communicator closes its engines first, whatever order the garbage collector
        # finalises them in (a model, its hooks and its engine form a cycle), and empties
        # their boxes so that they are not used or closed again.

    @property
    def in_process(self):
        """True when the ranks are threads of this process (local_group())."""
        return self.backend == "local"

    @property
    def device_buffers_only(self):
        """True when collectives take GPU memory only (NCCL)."""
        return self.backend == "nccl"

    @property
    def _handle(self):
        return ctypes.c_void_p(self._owner.value if self._owner is not None else None)

    @property
    def handle(self):
        """The zero_comm* for the C ABI."""
        return self._handle

    @property
    def rank(self):
        """This rank's index."""
        return library().zero_comm_rank(self._handle)

    @property
    def size(self):
        """The number of ranks."""
        return library().zero_comm_size(self._handle)

    def broadcast_bytes(self, address, nbytes, root=0, timeout_s=600.0):
        """Copies `nbytes` bytes at `address` (host memory; device memory for an NCCL
        communicator) from rank `root` to every rank, bit for bit (collective)."""
        status = library().zero_comm_broadcast_bytes(
            self._handle, ctypes.c_void_p(address), nbytes, root, timeout_s)
        _check(status, "zero_comm_broadcast_bytes")

    def all_reduce_f32(self, address, count, op="sum", timeout_s=600.0):
        """Reduces `count` float32 values at `address` (host memory) over every rank, in
        place: op "sum" or "max" (collective; every rank calls it with the same count)."""
        if op not in REDUCE_OPS:
            raise errors.InvalidArgumentError(
                f"all_reduce_f32: op {op!r} is not one of {sorted(REDUCE_OPS)}", 3)
        status = library().zero_comm_all_reduce_f32(
            self._handle, ctypes.c_void_p(address), count, REDUCE_OPS[op], timeout_s)
        _check(status, "zero_comm_all_reduce_f32")

    def close(self):
        """Closes every engine still open on it, then frees the communicator (at once, or
        after the last tensor viewing a closed engine's memory is gone)."""
        for handle in list(self._engines):
            self._close_engine(handle)
        self._owner = None

    def _close_engine(self, handle):
        """Runs an engine's before-close callbacks and frees it (once; its memory goes
        when no tensor views it any more)."""
        entry = self._engines.pop(handle, None)
        if entry is None:
            return
        box, callbacks, owner = entry
        try:
            for callback in callbacks:
                method = callback()  # a weak method: None once its object is gone
                if method is not None:
                    method()
        finally:
            box[0] = None
            del entry, owner  # the engine is freed here unless views of its memory remain

    def __del__(self):
        if _lib is not None:
            self.close()


def local_group(world):
    """`world` in-process ranks (run one thread per rank): a list of Communicators."""
    handles = (ctypes.c_void_p * world)()
    _check(library().zero_comm_local_group(world, handles), "zero_comm_local_group")
    return [Communicator(h, "local") for h in handles]


def mpi_communicator(abort_job_on_exception=True):
    """This process's rank of MPI_COMM_WORLD (one process per rank under mpirun).

    `abort_job_on_exception`: from now on an uncaught exception that ends this process
    ends every rank of the job too (MPI_Abort, after its traceback is printed), as
    `python -m mpi4py` does. Otherwise its peers would wait for it: in a collective until
    guard.timeout_s, or forever where they create a communicator or finalise MPI. Not in an
    interactive interpreter (where an uncaught exception ends nothing), and not for sys.exit()
    or os._exit(), which are no exceptions reaching sys.excepthook. A rank that ends by
    sys.exit() while its peers go on tells them it left as its communicator goes: a collective
    they wait in then fails naming it."""
    handle = ctypes.c_void_p()
    _check(library().zero_comm_mpi(None, ctypes.byref(handle)), "zero_comm_mpi")
    comm = Communicator(handle.value, "mpi")
    if abort_job_on_exception and comm.size > 1:
        _abort_job_on_uncaught_exception(comm.rank, comm.size)
    return comm


def _abort_job_on_uncaught_exception(rank, world):
    """Chains a sys.excepthook (once per process) that prints the exception as before, then
    ends the MPI job."""
    previous = sys.excepthook
    if (getattr(previous, "ends_the_mpi_job", False) or hasattr(sys, "ps1")
            or sys.flags.interactive):
        return

    def end_the_job(kind, value, traceback):
        try:
            previous(kind, value, traceback)
        finally:
            sys.stderr.write(
                f"zerort: rank {rank} of {world} ends with an uncaught {kind.__name__}; ending "
                "every rank of the MPI job (MPI_Abort) so that none waits for it (pass "
                "abort_job_on_exception=False to zerort.mpi_communicator() to keep them)\n")
            sys.stdout.flush()
            sys.stderr.flush()
            library().zero_abort_mpi_job(1)  # returns only when MPI is already finalised

    end_the_job.ends_the_mpi_job = True
    sys.excepthook = end_the_job


def nccl_communicator(bootstrap=None, device=-1, stream=None):
    """This rank's NCCL communicator (device buffers, one rank per GPU) over the ranks of
    `bootstrap` (a Communicator; None: this process's MPI rank), which carries NCCL's unique
    id from its rank 0. `device`: this rank's CUDA device (-1: the current one); `stream`:
    the cudaStream_t the trainer computes on, as an int (None: the legacy default stream).
    Collective over `bootstrap`. UnimplementedError in builds without NCCL."""
    if bootstrap is None:
        bootstrap = mpi_communicator()
    handle = ctypes.c_void_p()
    _check(library().zero_comm_nccl(bootstrap.handle, device, stream, ctypes.byref(handle)),
           "zero_comm_nccl")
    return Communicator(handle.value, "nccl", stream=int(stream or 0))


def external_communicator(rank, size, collectives, ranks_on_this_host=1,
                          check_timeout_s=1800.0):
    """This rank's communicator of a group of `size` ranks whose collectives `collectives`
    runs (zero_comm_external; zerort.torch.torch_communicator() builds one over
    torch.distributed). `collectives` has start(collective) -> an int handle, wait(handle,
    timeout_s), test(handle) -> bool, release(handle) and optionally destroy() (called
    once the communicator and its collectives are gone), for collectives described by a
    zerort._library.Collective over host memory (the C ABI's zero_collective says what each
    kind reads and writes). An exception from start or wait fails the collective with its
    message: a ZeroError keeps its status, a TimeoutError is a deadline, anything else an
    internal error. `ranks_on_this_host`: ranks sharing this machine's cores;
    `check_timeout_s`: the longest wait of the cross-rank check before a tagged collective."""
    table = _collectives_table(collectives)
    handle = ctypes.c_void_p()
    _check(library().zero_comm_external(rank, size, ranks_on_this_host, check_timeout_s,
                                        ctypes.byref(table), ctypes.byref(handle)),
           "zero_comm_external")
    return Communicator(handle.value, "external", keep=table)


def _collectives_table(collectives):
    """`collectives`' methods as a zero_collectives table (its functions must live as long
    as the communicator: the Communicator keeps the table)."""

    def failed(error, message, capacity):
        status = getattr(error, "status", None)
        if not isinstance(status, int) or status <= 0:
            timed_out = isinstance(error, TimeoutError) or "timed out" in str(error).lower()
            status = errors.DeadlineExceededError.status if timed_out else \
                errors.InternalError.status
        text = getattr(error, "message", None) or f"{type(error).__name__}: {error}"
        data = text.encode(errors="replace")[:max(capacity - 1, 0)] + b"\0"
        if capacity > 0:
            ctypes.memmove(message, data, len(data))
        return status

    def start(_, collective, handle, message, capacity):
        try:
            handle[0] = int(collectives.start(collective.contents))
            return 0
        except BaseException as error:  # noqa: BLE001 - no exception may cross into C
            return failed(error, message, capacity)

    def wait(_, handle, timeout_s, message, capacity):
        try:
            collectives.wait(handle, timeout_s)
            return 0
        except BaseException as error:  # noqa: BLE001
            return failed(error, message, capacity)

    def test(_, handle):
        try:
            return 1 if collectives.test(handle) else 0
        except BaseException:  # noqa: BLE001 - a failed collective has completed
            return 1

    def release(_, handle):
        try:
            collectives.release(handle)
        except BaseException:  # noqa: BLE001
            pass

    def destroy(_):
        try:
            collectives.destroy()
        except BaseException:  # noqa: BLE001 - the interpreter may be finalising
            pass

    has_destroy = callable(getattr(collectives, "destroy", None))
    return Collectives(None, COLLECTIVE_START_FN(start), COLLECTIVE_WAIT_FN(wait),
                       COLLECTIVE_TEST_FN(test), COLLECTIVE_RELEASE_FN(release),
                       COLLECTIVE_DESTROY_FN(destroy) if has_destroy else COLLECTIVE_DESTROY_FN())


def _full_state_code(state, call):
    """FULL_STATES[state], or an InvalidArgumentError naming `call`."""
    if state not in FULL_STATES:
        raise errors.InvalidArgumentError(
            f"{call}: state {state!r} is not one of {sorted(FULL_STATES)}",
            errors.InvalidArgumentError.status)
    return FULL_STATES[state]


def config_dict(config):
    """A config given as a dict, a JSON string, a path to a JSON file, or None ({})."""
    if config is None:
        return {}
    if isinstance(config, dict):
        return dict(config)
    text = os.fspath(config) if isinstance(config, os.PathLike) else str(config)
    if os.path.exists(text):
        with open(text, encoding="utf-8") as file:
            text = file.read()
    elif text.endswith(".json") and not text.lstrip().startswith("{"):
        raise errors.InvalidArgumentError(f"config file {text} does not exist", 3)
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise errors.InvalidArgumentError(f"config is not JSON: {error}", 3) from None


def _json_value(value, key):
    """`value` as a JSON value: numbers held in one-element tensors or NumPy scalars become
    numbers; anything else JSON cannot hold, and numbers that are not finite, are an
    InvalidArgumentError naming the config key `key`."""
    if isinstance(value, dict):
        result = {}
        for name, item in value.items():
            if not isinstance(name, str):
                raise errors.InvalidArgumentError(
                    f"config key \"{key}\" has a key {name!r} that is not a string", 3)
            result[name] = _json_value(item, f"{key}.{name}" if key else name)
        return result
    if isinstance(value, (list, tuple)):
        return [_json_value(item, f"{key}[{index}]") for index, item in enumerate(value)]
    if value is None or isinstance(value, (str, bool)):
        return value
    if not isinstance(value, (int, float)) and callable(getattr(value, "item", None)):
        try:
            value = value.item()  # a one-element tensor or array, a NumPy scalar
        except (TypeError, ValueError, RuntimeError):
            pass
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise errors.InvalidArgumentError(
                f"config key \"{key}\": {value} is not a finite number", 3)
        return float(value)
    raise errors.InvalidArgumentError(
        f"config key \"{key}\": {value!r} ({type(value).__name__}) is not a JSON value "
        "(a number, string, boolean, null, list or object)", 3)


def config_json(config):
    """The JSON text of a config given as config_dict() takes it (see _json_value)."""
    return json.dumps(_json_value(config_dict(config), ""))


def normalize_config(config):
    """The ZeroRT config (a dict) for `config`: a ZeroRT or DeepSpeed config, given as
    config_dict() takes it, translated and checked by the library (zero_config_normalize)
    exactly as zero_engine_create would; InvalidArgumentError names what is wrong."""
    text = config_json(config)
    out = ctypes.c_char_p()
    _check(library().zero_config_normalize(text.encode(), ctypes.byref(out)),
           "zero_config_normalize")
    return json.loads(out.value.decode())


def is_deepspeed_config(config):
    """Whether `config` (as config_dict() takes it) is a DeepSpeed config, as the library
    tells them apart (zero_config_is_deepspeed)."""
    return library().zero_config_is_deepspeed(config_json(config).encode()) == 1


def resolve_checkpoint(directory):
    """The checkpoint directory a load of `directory` reads (zero_ckpt_resolve): the tag its
    `latest` names, itself when it holds meta.json, the newest checkpoint in it when a
    series' first save stopped before `latest` was written, else itself."""
    out = ctypes.c_char_p()
    _check(library().zero_ckpt_resolve(os.fsencode(directory), ctypes.byref(out)),
           "zero_ckpt_resolve")
    return os.fsdecode(out.value)


class CheckpointReader:
    """A checkpoint read without an engine or ranks (zero_ckpt_*, zero/checkpoint.h): what
    it holds, whether it is intact, and each param's full fp32 value, in one process.

        with CheckpointReader("ckpt") as reader:        # or a series root with `latest`
            reader.verify()
            for index, param in enumerate(reader.params):
                reader.read_param(index, address)        # param["numel"] floats
    """

    def __init__(self, directory):
        handle = ctypes.c_void_p()
        _check(library().zero_ckpt_open(os.fsencode(directory), ctypes.byref(handle)),
               "zero_ckpt_open")
        self._handle = _Handle(handle.value, "zero_ckpt_close")
        text = ctypes.c_char_p()
        _check(library().zero_ckpt_describe(self._live(), ctypes.byref(text)),
               "zero_ckpt_describe")
        self.description = json.loads(text.value.decode())

    def _live(self):
        if self._handle.value is None:
            raise errors.FailedPreconditionError("this checkpoint reader was closed", 9)
        return self._handle.value

    @property
    def params(self):
        """One dict per param, in registration order: name, shape, dtype (trained in),
        numel, requires_grad, saved (False: a frozen param saved without
        checkpoint.save_frozen) and aliases (its other names: a tied weight's)."""
        return self.description["params"]

    @property
    def user_data(self):
        """The trainer's text saved with the checkpoint (zero_set_checkpoint_user_data)."""
        return self.description["user_data"]

    def verify(self):
        """Reads every record and checks its checksum; DataLossError names what is wrong."""
        _check(library().zero_ckpt_verify(self._live()), "zero_ckpt_verify")

    def read_param(self, index, address):
        """Writes param `index`'s full fp32 value (its numel floats) at `address`."""
        _check(library().zero_ckpt_read_param(self._live(), index, address),
               "zero_ckpt_read_param")

    def close(self):
        """Frees the reader (closing a closed reader does nothing)."""
        self._handle.free()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Engine:
    """One rank's engine: the C ABI's calls one to one (include/zero/zero.h)."""

    def __init__(self, config, comm):
        self._box = [None]  # the zero_engine*; emptied when it is closed
        self._lend_error = None  # an exception of the gathered-memory lender, until reported
        handle = ctypes.c_void_p()
        text = config_json(config)
        _check(library().zero_engine_create(text.encode(), comm.handle, ctypes.byref(handle)),
               "zero_engine_create")
        self._box[0] = handle
        self._comm = comm  # kept alive while the engine is
        comm._engines[handle.value] = (self._box, [],
                                       _Handle(handle.value, "zero_engine_destroy",
                                               keep=comm._owner))

    @property
    def _handle(self):
        handle = self._box[0]
        if handle is None:
            raise errors.FailedPreconditionError(
                "this engine was closed (by close(), or by its communicator's close())", 9)
        return handle

    @property
    def closed(self):
        """True once the engine has been closed."""
        return self._box[0] is None

    @property
    def memory_owner(self):
        """The object that keeps the engine's memory: a tensor viewing that memory (a
        param_data view) must hold it, so that the memory outlives the view (close()
        frees the engine's memory only once no such object is left)."""
        return self._comm._engines[self._handle.value][2]

    def register_param(self, name, shape, dtype="fp32", requires_grad=True,
                       group=0, unit=-1):
        """Registers a param; returns its id. `dtype`: "fp32", "bf16" or "fp16"."""
        if dtype not in DTYPES:
            raise errors.InvalidArgumentError(
                f"registering {name}: dtype {dtype!r} is not one of {', '.join(DTYPES)}",
                errors.InvalidArgumentError.status)
        dims = (ctypes.c_int64 * max(1, len(shape)))(*shape)
        pid = ctypes.c_int64()
        _check(library().zero_register_param(
            self._handle, name.encode(), dims, len(shape), DTYPES[dtype],
            int(requires_grad), group, unit, ctypes.byref(pid)),
            f"registering {name}")
        return pid.value

    def add_param_alias(self, pid, alias):
        """Another name of param `pid` (a tied weight's), before finalize(): checkpoints
        record it (zero_add_param_alias)."""
        _check(library().zero_add_param_alias(self._handle, pid, alias.encode()),
               "zero_add_param_alias")

    def finalize(self):
        """Builds the layout and checks that every rank registered the same params."""
        _check(library().zero_finalize(self._handle), "zero_finalize")

    def set_stream(self, stream):
        """Device "cuda": the cudaStream_t (an int; None: the legacy default stream) the
        trainer computes on; the engine orders its work after what is queued there."""
        _check(library().zero_set_stream(self._handle, stream), "zero_set_stream")

    def set_param(self, pid, address):
        """Copies a full param from `address` (host memory, or device memory on device
        "cuda") into the engine."""
        _check(library().zero_set_param(self._handle, pid, address), "zero_set_param")

    def get_param(self, pid, address):
        """Copies a full param to `address` (host memory, or device memory on device
        "cuda"; collective at stage 3)."""
        self._check_lent(library().zero_get_param(self._handle, pid, address),
                         "zero_get_param")

    def get_full_state(self, pid, state, address):
        """Copies a trainable param's full fp32 `state` ("weights", "first_moment",
        "second_moment" or "grad"; see FULL_STATES) as numel floats to `address` (host
        memory) on every rank; collective at stages 1-3 (zero_get_full_state)."""
        _check(library().zero_get_full_state(self._handle, pid,
                                             _full_state_code(state, "get_full_state"), address),
               "zero_get_full_state")

    def set_full_state(self, pid, state, address):
        """Sets a trainable param's full fp32 `state` ("weights", which also sets the param,
        or a moment) from numel floats at `address` (host memory); every rank passes the same
        values and keeps its part (zero_set_full_state)."""
        _check(library().zero_set_full_state(self._handle, pid,
                                             _full_state_code(state, "set_full_state"), address),
               "zero_set_full_state")

    def param_data(self, pid):
        """The address of the engine's full copy of a param (stages 0-2; device memory on
        device "cuda")."""
        view = ctypes.c_void_p()
        _check(library().zero_param_data(self._handle, pid, ctypes.byref(view)),
               "zero_param_data")
        return view.value

    def grad_absent(self, pid):
        """guard.on_unused = "zero": the param gets no gradient in this micro-batch; it
        completes now with zeros and does not count as used (a param no rank used in a step
        is left untouched by it, its step count included)."""
        _check(library().zero_grad_absent(self._handle, pid), "zero_grad_absent")

    def accumulate_grad(self, pid, address, on_device=False):
        """Adds a gradient (the param's dtype, at `address`: host memory, or device memory
        on device "cuda", written on the engine's stream) and marks it ready. `on_device`
        says the address is the engine's device memory, which spares the pointer query."""
        if on_device:
            _check(library().zero_accumulate_device_grad(self._handle, pid, address),
                   "zero_accumulate_device_grad")
        else:
            _check(library().zero_accumulate_grad(self._handle, pid, address),
                   "zero_accumulate_grad")

    def lend_grad(self, pid, address, on_device=False):
        """accumulate_grad for a gradient left unchanged at `address` until a step returns
        successfully: where a copy is all the engine would do with it (the param's first
        gradient in the step's last micro-batch, no widening; one rank, or a param that fills
        its bucket alone, whose reduction then reads it), the engine reads it there instead.
        Returns whether it did (False: it was copied)."""
        kept = ctypes.c_int()
        _check(library().zero_lend_grad(self._handle, pid, address, int(on_device),
                                        ctypes.byref(kept)), "zero_lend_grad")
        return bool(kept.value)

    def accumulate_grads(self, pids, addresses, on_device=False, lend=False):
        """accumulate_grad (lend_grad with `lend`) for several gradients in one call, in
        order: param pids[i]'s gradient at addresses[i]. Returns, with `lend`, whether each
        was kept (else None). On a failure raises the error of the first gradient that failed,
        its `handed` attribute saying how many before it were handed over, and its `kept`
        attribute whether each of those was kept (with `lend`; else None)."""
        count = len(pids)
        kept = (ctypes.c_int * count)() if lend else None
        handed = ctypes.c_int64()
        flags = (_GRADS_ON_DEVICE if on_device else 0) | (_GRADS_LEND if lend else 0)
        status = library().zero_accumulate_grads(
            self._handle, count, (ctypes.c_int64 * count)(*pids),
            (ctypes.c_void_p * count)(*addresses), flags, kept, ctypes.byref(handed))
        if status != 0:
            message = library().zero_last_error().decode(errors="replace")
            error = errors.error_for(status, f"zero_accumulate_grads: {message}")
            error.handed = handed.value
            error.kept = [bool(k) for k in kept[:handed.value]] if lend else None
            raise error
        return [bool(k) for k in kept] if lend else None

    def sync_replicas(self):
        """Collective, between steps: every rank's params become rank 0's (or are checked
        equal: guard.init_params) now, as the first begin_iteration() does; that one
        compares them again."""
        _check(library().zero_sync_replicas(self._handle), "zero_sync_replicas")

    def begin_iteration(self):
        """Starts a micro-batch."""
        _check(library().zero_begin_iteration(self._handle), "zero_begin_iteration")

    def end_backward(self):
        """Ends a micro-batch's backward: launches what is left and waits."""
        _check(library().zero_end_backward(self._handle), "zero_end_backward")

    def step(self):
        """The optimizer step; returns a dict with step, skipped, grad_norm, loss_scale."""
        info = StepInfo()
        _check(library().zero_step(self._handle, ctypes.byref(info)), "zero_step")
        return {"step": info.step, "skipped": bool(info.skipped),
                "grad_norm": info.grad_norm, "loss_scale": info.loss_scale}

    def drop_gradients(self):
        """Drops the gradients of the micro-batches ended since the last step (collective);
        the next micro-batch starts a new step."""
        _check(library().zero_drop_gradients(self._handle), "zero_drop_gradients")

    def abandon_micro_batch(self):
        """Ends a micro-batch whose backward did not finish (missing gradients as zeros)
        and drops the step's gradients (collective; Engine::AbandonMicroBatch)."""
        _check(library().zero_abandon_micro_batch(self._handle), "zero_abandon_micro_batch")

    def gather(self, unit):
        """Stage 3: makes a unit's full params available."""
        self._check_lent(library().zero_gather(self._handle, unit), "zero_gather")

    def gathered_place(self, pid):
        """Stage 3: where a param sits in its unit's gathered memory: (unit, byte offset,
        the unit's gathered bytes, whether the unit is persistent, held by the engine)."""
        unit, persistent = ctypes.c_int(), ctypes.c_int()
        offset, nbytes = ctypes.c_int64(), ctypes.c_int64()
        _check(library().zero_gathered_place(
            self._handle, pid, ctypes.byref(unit), ctypes.byref(offset), ctypes.byref(nbytes),
            ctypes.byref(persistent)), "zero_gathered_place")
        return unit.value, offset.value, nbytes.value, bool(persistent.value)

    def lend_gathered_memory(self, lend, give_back):
        """Stage 3: gathered units live in memory the trainer lends from now on
        (Engine::LendGatheredMemory): `lend(unit, nbytes)` returns the address of `nbytes`
        bytes for `unit` (device memory on device "cuda"), untouched by the trainer until
        `give_back(unit)`. Both run inside this engine's calls, on the calling thread, and
        are kept as long as the engine's memory is (refer to big objects weakly). An
        exception in `lend` fails the gather that needed it (raised from that error); one in
        `give_back` is lost (it must not raise). lend_gathered_memory(None, None) stops
        lending (prefetched units are given back first, nothing after); it raises when the
        group broke, as a collective may still write into memory lent until then."""
        if lend is None and give_back is None:
            _check(_stop_lending(self._handle), "zero_lend_gathered_memory")
            return

        this = weakref.ref(self)  # the callbacks live with the C engine, not with this

        def lend_c(_user, unit, nbytes, memory):
            try:
                memory[0] = lend(unit, nbytes)
                return 0
            except Exception as error:  # pylint: disable=broad-except
                engine = this()
                if engine is not None:
                    engine._lend_error = error  # the cause of the gather's error
                if isinstance(error, MemoryError) or "out of memory" in str(error):
                    return errors.ResourceExhaustedError.status
                return errors.InternalError.status

        def give_back_c(_user, unit):
            try:
                give_back(unit)
            except Exception:  # pylint: disable=broad-except
                pass  # nothing can be raised through the C library

        callbacks = (LEND_FN(lend_c), GIVE_BACK_FN(give_back_c))
        _check(library().zero_lend_gathered_memory(self._handle, *callbacks, None),
               "zero_lend_gathered_memory")
        # The C engine calls them until it is freed: they live as long as its handle.
        self.memory_owner.lender_callbacks = callbacks

    def stop_lending_at_close(self, keep):
        """At close (by close(), the communicator's, or the garbage collector), before the C
        engine can be freed: stops the lending of gathered memory, and calls `keep()` when
        the group broke (memory lent until then may still be written: never free it). Holds
        neither this object nor the engine's memory."""
        box = self._box

        def stop():
            if _stop_lending(box[0]) != 0:
                keep()

        self.on_close(stop, weak=False)

    def _check_lent(self, status, what):
        """_check for calls that may lend gathered memory: an exception the lender raised
        is the cause of the error."""
        lend_error, self._lend_error = self._lend_error, None
        try:
            _check(status, what)
        except errors.ZeroError as error:
            if lend_error is None:
                raise
            raise error from lend_error

    def release(self, unit):
        """Stage 3: frees a unit's gathered params."""
        _check(library().zero_release(self._handle, unit), "zero_release")

    def release_until_backward(self, unit):
        """Stage 3: release() at the end of a unit's forward whose backward follows: a unit
        the recorded gather order gathers again before stage3.max_reuse_elems elements of
        other units (DeepSpeed's stage3_max_reuse_distance) stays gathered for that backward
        (counters()["releases_kept"]), in any phase. Nothing may write into its params
        until it is gathered again. release() always frees."""
        _check(library().zero_release_until_backward(self._handle, unit),
               "zero_release_until_backward")

    def release_cached_units(self):
        """Stage 3: frees every gathered unit nobody holds (prefetched, kept for backward,
        buffers kept for reuse), as DeepSpeed's empty_partition_cache; every rank calls it at
        the same point. Nothing at stages 0-2."""
        _check(library().zero_release_cached_units(self._handle), "zero_release_cached_units")

    def save_checkpoint(self, directory, tag=None):
        """Saves this rank's part of a checkpoint (every rank calls it). With a tag: into
        directory/tag, then directory/latest names it and only the newest
        checkpoint.keep_last stay."""
        if tag is None:
            _check(library().zero_save_checkpoint(self._handle, str(directory).encode()),
                   "zero_save_checkpoint")
        else:
            _check(library().zero_save_checkpoint_tagged(
                self._handle, str(directory).encode(), str(tag).encode()),
                "zero_save_checkpoint_tagged")

    def preemption_requested(self):
        """Whether any rank received SIGTERM/SIGUSR1 after install_preemption_handler()
        (collective: call it on every rank between steps; the same answer everywhere)."""
        requested = ctypes.c_int(0)
        _check(library().zero_preemption_requested(self._handle, ctypes.byref(requested)),
               "zero_preemption_requested")
        return bool(requested.value)

    def load_checkpoint(self, directory):
        """Loads a checkpoint saved at any world size and stage (or the one
        directory/latest names)."""
        _check(library().zero_load_checkpoint(self._handle, str(directory).encode()),
               "zero_load_checkpoint")

    def set_checkpoint_user_data(self, text):
        """The trainer's own state (text) to save inside the next checkpoints (rank 0's)."""
        _check(library().zero_set_checkpoint_user_data(self._handle, text.encode()),
               "zero_set_checkpoint_user_data")

    def checkpoint_user_data(self):
        """The trainer state of the checkpoint last loaded ("" if none)."""
        data = ctypes.c_char_p()
        _check(library().zero_checkpoint_user_data(self._handle, ctypes.byref(data)),
               "zero_checkpoint_user_data")
        return (data.value or b"").decode()

    def memory_stats(self):
        """Bytes per category: {"params": (current, peak), ...}."""
        stats = MemoryStats()
        _check(library().zero_memory_stats(self._handle, ctypes.byref(stats)),
               "zero_memory_stats")
        return {name: (stats.current[i], stats.peak[i])
                for i, name in enumerate(MEMORY_CATEGORIES)}

    def counters(self):
        """What the engine has done so far (EngineCounters): reductions launched (and before
        end_backward), buffer-pool waits, stage-3 gathers prefetched and on demand, trace
        restarts, checkpoint bytes read; a dict of ints."""
        counters = EngineCounters()
        _check(library().zero_engine_counters_sized(self._handle, ctypes.byref(counters),
                                                    ctypes.sizeof(counters)),
               "zero_engine_counters_sized")
        return {name: getattr(counters, name) for name, _ in EngineCounters._fields_}

    @property
    def num_groups(self):
        """The number of optimizer groups."""
        groups = ctypes.c_int()
        _check(library().zero_num_groups(self._handle, ctypes.byref(groups)),
               "zero_num_groups")
        return groups.value

    def group_hyper(self, group):
        """Group `group`'s hyperparameters for the next step: a dict of HYPER_FIELDS (with a
        scheduler, the schedule's lr)."""
        hyper = GroupHyper()
        _check(library().zero_get_group_hyper(self._handle, group, ctypes.byref(hyper)),
               "zero_get_group_hyper")
        values = {name: getattr(hyper, name) for name in HYPER_FIELDS}
        values["nesterov"] = bool(values["nesterov"])
        return values

    def set_group_hyper(self, group, values):
        """Sets group `group`'s hyperparameters (a dict of HYPER_FIELDS; a field it leaves
        out keeps its value) for the following steps. Between steps, the same on every rank."""
        unknown = set(values) - set(HYPER_FIELDS)
        if unknown:
            raise errors.InvalidArgumentError(
                f"set_group_hyper: unknown fields {sorted(unknown)}; known: {HYPER_FIELDS}", 3)
        merged = dict(self.group_hyper(group), **values)
        hyper = GroupHyper(*(merged[name] for name in HYPER_FIELDS[:-1]),
                           int(bool(merged["nesterov"])))
        _check(library().zero_set_group_hyper(self._handle, group, ctypes.byref(hyper)),
               f"zero_set_group_hyper (group {group})")

    def lr(self, group=0):
        """Group `group`'s learning rate for the next step."""
        value = ctypes.c_float()
        _check(library().zero_get_lr(self._handle, group, ctypes.byref(value)), "zero_get_lr")
        return value.value

    def set_lr(self, group, lr):
        """Sets group `group`'s learning rate for the following steps (between steps)."""
        _check(library().zero_set_lr(self._handle, group, lr), f"zero_set_lr (group {group})")

    def last_grad_norm(self):
        """The last step's global gradient norm; read from the GPU when the step left it
        there ("sync_grad_norm": false), which waits for the GPU once."""
        value = ctypes.c_float()
        _check(library().zero_last_grad_norm(self._handle, ctypes.byref(value)),
               "zero_last_grad_norm")
        return value.value

    def clip_grad_norm(self, max_norm):
        """FSDP's clip_grad_norm_ (zero_clip_grad_norm): after the step's last end_backward,
        the global norm of the gradient the next step applies; that step clips to max_norm
        (0: none) instead of the config's clip_grad_norm. Collective."""
        value = ctypes.c_float()
        _check(library().zero_clip_grad_norm(self._handle, float(max_norm), ctypes.byref(value)),
               "zero_clip_grad_norm")
        return value.value

    @property
    def loss_scale(self):
        """The loss scale to multiply the next loss by (1 without loss scaling; after
        load_checkpoint, the checkpoint's when the engine scales dynamically)."""
        value = ctypes.c_float()
        _check(library().zero_loss_scale(self._handle, ctypes.byref(value)), "zero_loss_scale")
        return value.value

    @property
    def lr_schedule_iteration(self):
        """The config scheduler's position (DeepSpeed's last_batch_iteration): -1 before the
        first applied step, and without a scheduler."""
        iteration = ctypes.c_int64()
        _check(library().zero_lr_schedule_iteration(self._handle, ctypes.byref(iteration)),
               "zero_lr_schedule_iteration")
        return iteration.value

    @property
    def rank(self):
        """This rank's index."""
        return library().zero_engine_rank(self._handle)

    @property
    def world_size(self):
        """The number of ranks."""
        return library().zero_engine_world_size(self._handle)

    def on_close(self, method, weak=True):
        """Runs `method()` just before the engine is closed (by close(), by its
        communicator's close(), or by the garbage collector's finalizer). weak=True: a bound
        method, run if its object still exists (only a weak reference is kept); weak=False:
        any callable, kept until then (it must not refer to what should be collectable)."""
        callbacks = self._comm._engines[self._handle.value][1]
        if weak:
            callbacks.append(weakref.WeakMethod(method))
        else:
            callbacks.append(lambda: method)

    def close(self):
        """Closes the engine (never blocks); its memory is freed once no tensor views it.
        Closing a closed engine does nothing."""
        if not self.closed:
            self._comm._close_engine(self._box[0].value)

    def __del__(self):
        if _lib is not None:
            self.close()
