"""Loading libzerort.so and declaring the C ABI (include/zero/zero.h) for ctypes."""
import ctypes
import os

_c_int64_p = ctypes.POINTER(ctypes.c_int64)
_void_pp = ctypes.POINTER(ctypes.c_void_p)


class StepInfo(ctypes.Structure):
    """zero_step_info: what one optimizer step did."""
    _fields_ = [("step", ctypes.c_int64), ("skipped", ctypes.c_int),
                ("grad_norm", ctypes.c_float), ("loss_scale", ctypes.c_float)]


class GroupHyper(ctypes.Structure):
    """zero_group_hyper: one optimizer group's hyperparameters."""
    _fields_ = [("lr", ctypes.c_float), ("beta1", ctypes.c_float), ("beta2", ctypes.c_float),
                ("eps", ctypes.c_float), ("weight_decay", ctypes.c_float),
                ("momentum", ctypes.c_float), ("dampening", ctypes.c_float),
                ("nesterov", ctypes.c_int)]


MEMORY_CATEGORIES = ("params", "grads", "optimizer", "comm", "gathered",
                     "workspace")


class EngineCounters(ctypes.Structure):
    """zero_engine_counters_t: what the engine has done so far."""
    _fields_ = [(name, ctypes.c_int64) for name in (
        "reductions_launched", "reductions_before_end_backward", "pool_waits",
        "gathers_prefetched", "gathers_on_demand", "trace_invalidations",
        "checkpoint_bytes_read", "grad_bytes_copied", "host_waits", "gather_allocations",
        "releases_kept", "pool_buffers_added")]


class MemoryStats(ctypes.Structure):
    """zero_memory_stats: bytes per category, current and peak."""
    _fields_ = [("current", ctypes.c_int64 * len(MEMORY_CATEGORIES)),
                ("peak", ctypes.c_int64 * len(MEMORY_CATEGORIES))]


# zero_lend_fn and zero_give_back_fn: a trainer's lender of stage-3 gathered memory.
LEND_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64,
                           ctypes.POINTER(ctypes.c_void_p))
GIVE_BACK_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int)


class Collective(ctypes.Structure):
    """zero_collective: one collective an external communicator's table runs."""
    _fields_ = [("kind", ctypes.c_int), ("send", ctypes.c_void_p), ("recv", ctypes.c_void_p),
                ("count", ctypes.c_int64), ("dtype", ctypes.c_int), ("op", ctypes.c_int),
                ("root", ctypes.c_int), ("channel", ctypes.c_int)]


# zero_collectives' functions: a trainer's own collectives behind zero_comm_external.
COLLECTIVE_START_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(Collective),
                                       _c_int64_p, ctypes.c_void_p, ctypes.c_size_t)
COLLECTIVE_WAIT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int64,
                                      ctypes.c_double, ctypes.c_void_p, ctypes.c_size_t)
COLLECTIVE_TEST_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int64)
COLLECTIVE_RELEASE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)
COLLECTIVE_DESTROY_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class Collectives(ctypes.Structure):
    """zero_collectives: the table of functions an external communicator runs."""
    _fields_ = [("context", ctypes.c_void_p), ("start", COLLECTIVE_START_FN),
                ("wait", COLLECTIVE_WAIT_FN), ("test", COLLECTIVE_TEST_FN),
                ("release", COLLECTIVE_RELEASE_FN), ("destroy", COLLECTIVE_DESTROY_FN)]


# name: (argument types, result type); every call returning a status returns c_int.
_PROTOTYPES = {
    "zero_last_error": ([], ctypes.c_char_p),
    "zero_version": ([], ctypes.c_char_p),
    "zero_comm_local_group": ([ctypes.c_int, _void_pp], ctypes.c_int),
    "zero_comm_mpi": ([ctypes.c_void_p, _void_pp], ctypes.c_int),
    "zero_comm_nccl": ([ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, _void_pp],
                       ctypes.c_int),
    "zero_comm_external": ([ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_double,
                            ctypes.POINTER(Collectives), _void_pp], ctypes.c_int),
    "zero_comm_rank": ([ctypes.c_void_p], ctypes.c_int),
    "zero_comm_size": ([ctypes.c_void_p], ctypes.c_int),
    "zero_comm_destroy": ([ctypes.c_void_p], None),
    "zero_engine_create": ([ctypes.c_char_p, ctypes.c_void_p, _void_pp],
                           ctypes.c_int),
    "zero_engine_destroy": ([ctypes.c_void_p], None),
    "zero_register_param": ([ctypes.c_void_p, ctypes.c_char_p, _c_int64_p,
                             ctypes.c_int, ctypes.c_int, ctypes.c_int,
                             ctypes.c_int, ctypes.c_int, _c_int64_p],
                            ctypes.c_int),
    "zero_config_is_deepspeed": ([ctypes.c_char_p], ctypes.c_int),
    "zero_add_param_alias": ([ctypes.c_void_p, ctypes.c_int64, ctypes.c_char_p],
                             ctypes.c_int),
    "zero_finalize": ([ctypes.c_void_p], ctypes.c_int),
    "zero_set_stream": ([ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int),
    "zero_set_param": ([ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p],
                       ctypes.c_int),
    "zero_get_param": ([ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p],
                       ctypes.c_int),
    "zero_param_data": ([ctypes.c_void_p, ctypes.c_int64, _void_pp],
                        ctypes.c_int),
    "zero_get_full_state": ([ctypes.c_void_p, ctypes.c_int64, ctypes.c_int,
                             ctypes.c_void_p], ctypes.c_int),
    "zero_set_full_state": ([ctypes.c_void_p, ctypes.c_int64, ctypes.c_int,
                             ctypes.c_void_p], ctypes.c_int),
    "zero_accumulate_grad": ([ctypes.c_void_p, ctypes.c_int64,
                              ctypes.c_void_p], ctypes.c_int),
    "zero_accumulate_device_grad": ([ctypes.c_void_p, ctypes.c_int64,
                                     ctypes.c_void_p], ctypes.c_int),
    "zero_lend_grad": ([ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int,
                        ctypes.POINTER(ctypes.c_int)], ctypes.c_int),
    "zero_accumulate_grads": ([ctypes.c_void_p, ctypes.c_int64,
                               ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_void_p),
                               ctypes.c_int, ctypes.POINTER(ctypes.c_int),
                               ctypes.POINTER(ctypes.c_int64)], ctypes.c_int),
    "zero_grad_ready": ([ctypes.c_void_p, ctypes.c_int64], ctypes.c_int),
    "zero_grad_absent": ([ctypes.c_void_p, ctypes.c_int64], ctypes.c_int),
    "zero_engine_counters_sized": ([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t],
                                   ctypes.c_int),
    "zero_sync_replicas": ([ctypes.c_void_p], ctypes.c_int),
    "zero_begin_iteration": ([ctypes.c_void_p], ctypes.c_int),
    "zero_end_backward": ([ctypes.c_void_p], ctypes.c_int),
    "zero_step": ([ctypes.c_void_p, ctypes.POINTER(StepInfo)], ctypes.c_int),
    "zero_drop_gradients": ([ctypes.c_void_p], ctypes.c_int),
    "zero_abandon_micro_batch": ([ctypes.c_void_p], ctypes.c_int),
    "zero_gather": ([ctypes.c_void_p, ctypes.c_int], ctypes.c_int),
    "zero_gathered_place": ([ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_int),
                             _c_int64_p, _c_int64_p, ctypes.POINTER(ctypes.c_int)],
                            ctypes.c_int),
    "zero_lend_gathered_memory": ([ctypes.c_void_p, LEND_FN, GIVE_BACK_FN, ctypes.c_void_p],
                                  ctypes.c_int),
    "zero_release": ([ctypes.c_void_p, ctypes.c_int], ctypes.c_int),
    "zero_release_until_backward": ([ctypes.c_void_p, ctypes.c_int], ctypes.c_int),
    "zero_release_cached_units": ([ctypes.c_void_p], ctypes.c_int),
    "zero_save_checkpoint": ([ctypes.c_void_p, ctypes.c_char_p], ctypes.c_int),
    "zero_save_checkpoint_tagged": ([ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p],
                                    ctypes.c_int),
    "zero_load_checkpoint": ([ctypes.c_void_p, ctypes.c_char_p], ctypes.c_int),
    "zero_abort_mpi_job": ([ctypes.c_int], ctypes.c_int),
    "zero_install_preemption_handler": ([], ctypes.c_int),
    "zero_preemption_requested": ([ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)],
                                  ctypes.c_int),
    "zero_set_checkpoint_user_data": ([ctypes.c_void_p, ctypes.c_char_p], ctypes.c_int),
    "zero_checkpoint_user_data": ([ctypes.c_void_p, ctypes.POINTER(ctypes.c_char_p)],
                                  ctypes.c_int),
    "zero_memory_stats": ([ctypes.c_void_p, ctypes.POINTER(MemoryStats)],
                          ctypes.c_int),
    "zero_comm_broadcast_bytes": ([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                   ctypes.c_int, ctypes.c_double], ctypes.c_int),
    "zero_engine_rank": ([ctypes.c_void_p], ctypes.c_int),
    "zero_num_groups": ([ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)], ctypes.c_int),
    "zero_get_group_hyper": ([ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(GroupHyper)],
                             ctypes.c_int),
    "zero_set_group_hyper": ([ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(GroupHyper)],
                             ctypes.c_int),
    "zero_set_lr": ([ctypes.c_void_p, ctypes.c_int, ctypes.c_float], ctypes.c_int),
    "zero_get_lr": ([ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_float)],
                    ctypes.c_int),
    "zero_lr_schedule_iteration": ([ctypes.c_void_p, _c_int64_p], ctypes.c_int),
    "zero_loss_scale": ([ctypes.c_void_p, ctypes.POINTER(ctypes.c_float)], ctypes.c_int),
    "zero_last_grad_norm": ([ctypes.c_void_p, ctypes.POINTER(ctypes.c_float)],
                            ctypes.c_int),
    "zero_clip_grad_norm": ([ctypes.c_void_p, ctypes.c_float, ctypes.POINTER(ctypes.c_float)],
                            ctypes.c_int),
    "zero_comm_all_reduce_f32": ([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                  ctypes.c_int, ctypes.c_double], ctypes.c_int),
    "zero_config_normalize": ([ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)],
                              ctypes.c_int),
    "zero_engine_world_size": ([ctypes.c_void_p], ctypes.c_int),
    "zero_ckpt_open": ([ctypes.c_char_p, _void_pp], ctypes.c_int),
    "zero_ckpt_describe": ([ctypes.c_void_p, ctypes.POINTER(ctypes.c_char_p)], ctypes.c_int),
    "zero_ckpt_verify": ([ctypes.c_void_p], ctypes.c_int),
    "zero_ckpt_read_param": ([ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p], ctypes.c_int),
    "zero_ckpt_close": ([ctypes.c_void_p], None),
    "zero_ckpt_resolve": ([ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)], ctypes.c_int),
}


def _candidates():
    """Where libzerort.so may be, most specific first."""
    explicit = os.environ.get("ZERORT_LIBRARY")
    if explicit:
        yield explicit
    here = os.path.dirname(os.path.abspath(__file__))
    # Installed with pip: the package carries its own copy (python/setup.py).
    yield os.path.join(here, "libzerort.so")
    # The build tree: python/zerort/ beside build/lib/.
    yield os.path.join(here, "..", "..", "build", "lib", "libzerort.so")
    # Installed: <prefix>/lib/python3/dist-packages/zerort/ or site-packages.
    for up in (3, 4):
        yield os.path.join(here, *([".."] * up), "libzerort.so")
    yield "libzerort.so"  # the dynamic loader's own search path


def load():
    """Loads libzerort.so (ZERORT_LIBRARY overrides the search) with prototypes.

    Raises OSError naming every place that was tried. A function that this library does not
    export (an older build) is left undeclared: calling it raises AttributeError naming it.
    """
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(path)
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as error:
            tried.append(f"{path} ({error})")
            continue
        for name, (argtypes, restype) in _PROTOTYPES.items():
            try:
                function = getattr(lib, name)
            except AttributeError:  # an older library: only that call is missing
                continue
            function.argtypes = argtypes
            function.restype = restype
        return lib
    raise OSError("libzerort.so not found; build it (make) or set "
                  "ZERORT_LIBRARY to its path. Tried: " + "; ".join(tried))
