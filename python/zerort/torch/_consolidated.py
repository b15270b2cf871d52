"""The model's full state dict from a checkpoint, in one process with no engine and no ranks:
what DeepSpeed's zero_to_fp32 gives (get_fp32_state_dict_from_zero_checkpoint and its kin,
also under zerort.torch.deepspeed.utils.zero_to_fp32), read through the library's checkpoint
reader (core.CheckpointReader; zero-ckpt consolidate writes the same values as safetensors).

    state = fp32_state_dict_from_checkpoint("checkpoints")       # the one `latest` names
    model.load_state_dict(state)

Run as a program, it writes the state dict with torch.save:

    python3 -m zerort.torch.deepspeed.utils.zero_to_fp32 checkpoints pytorch_model.bin
"""
import collections
import os
import warnings

import torch

from .. import core, errors
from ._checkpoint import resolve_latest, saved_module_state
from ._params import driven_param_name


def _checkpoint_dir(directory, tag):
    """The checkpoint directory to read: directory/tag, or the one directory/latest names, or
    directory itself."""
    if tag is not None:
        return os.path.join(os.fspath(directory), str(tag))
    return resolve_latest(directory)


def fp32_state_dict_from_checkpoint(directory, tag=None, exclude_frozen_parameters=False):
    """The state dict a checkpoint that zerort.torch saved holds: every saved param's full
    fp32 value, assembled from every rank's shard (any stage, any world size), under its name
    and under each other name of a tied weight (one tensor, as the model's state dict shares
    it), then the persistent module buffers saved with it (rank 0's). Every record's checksum
    is checked first: a damaged or incomplete checkpoint is a DataLossError naming the file.

    `directory`: a checkpoint, or a series root whose `latest` names one; `tag` picks
    directory/tag instead. Frozen params are in a checkpoint only when it was saved with
    checkpoint.save_frozen (a LoRA job's checkpoint holds its adapters: its base comes from
    where it was loaded); those missing are named in a warning, unless
    `exclude_frozen_parameters`, which also leaves out frozen params that were saved."""
    path = _checkpoint_dir(directory, tag)
    with core.CheckpointReader(path) as reader:
        reader.verify()
        state = collections.OrderedDict()
        missing = []
        for index, param in enumerate(reader.params):
            if not param["requires_grad"] and exclude_frozen_parameters:
                continue
            if not param["saved"]:
                missing.append(param["name"])
                continue
            value = torch.empty(param["shape"], dtype=torch.float32)
            reader.read_param(index, value.data_ptr())
            for name in [param["name"]] + param["aliases"]:
                state[name] = value
        buffers, not_kept, empty = saved_module_state(reader.user_data)
        for name, (shape, frozen) in empty.items():  # without elements: never in the records
            if not (frozen and exclude_frozen_parameters):
                state[name] = torch.zeros(shape, dtype=torch.float32)
        for name, buffer in buffers.items():
            state[name] = buffer
    if not exclude_frozen_parameters:
        missing += not_kept  # frozen params below stage 3 without save_frozen
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5
                                          else "")
        warnings.warn(f"zerort.torch: the checkpoint {path} does not hold {len(missing)} frozen "
                      f"params ({shown}): it was saved without checkpoint.save_frozen; load "
                      "them from where the model came from (load_state_dict(strict=False) "
                      "keeps the model's own), or pass exclude_frozen_parameters=True",
                      stacklevel=2)
    return state


def save_fp32_state_dict(directory, output_file, tag=None, exclude_frozen_parameters=False):
    """Writes fp32_state_dict_from_checkpoint(directory, tag, exclude_frozen_parameters) to
    `output_file` with torch.save (a directory, existing or named with a trailing slash: its
    pytorch_model.bin) and returns the path written. The file appears whole or not at all
    (written beside it, then renamed)."""
    output_file = os.fspath(output_file)
    if output_file.endswith(os.sep) or os.path.isdir(output_file):  # a directory
        output_file = os.path.join(output_file, "pytorch_model.bin")
    checkpoint = os.path.realpath(_checkpoint_dir(directory, tag))
    if os.path.realpath(output_file).startswith(checkpoint + os.sep):
        raise errors.InvalidArgumentError(
            f"zerort.torch: {output_file} is inside the checkpoint {checkpoint}: writing there "
            "would damage it; choose a path outside", errors.InvalidArgumentError.status)
    if os.path.dirname(output_file):
        os.makedirs(os.path.dirname(output_file), exist_ok=True)
    state = fp32_state_dict_from_checkpoint(directory, tag, exclude_frozen_parameters)
    partial = output_file + ".partial"
    try:
        torch.save(state, partial)
        os.replace(partial, output_file)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return output_file


def load_fp32_state_dict(model, directory, tag=None):
    """Loads fp32_state_dict_from_checkpoint(directory, tag) into `model` (moved to the CPU
    first, as DeepSpeed's load_state_dict_from_zero_checkpoint does; strict=False, so that
    frozen params the checkpoint does not hold keep the model's values) and returns the model.
    A model an open engine drives is refused: load its checkpoint with
    engine.load_checkpoint(), or close the engine first."""
    name = driven_param_name(model.named_parameters())
    if name is not None:
        raise errors.FailedPreconditionError(
            f"zerort.torch: param \"{name}\" is driven by an open engine, which owns its "
            "memory and its optimizer state: load a checkpoint into it with "
            "engine.load_checkpoint(dir) (collective), or call engine.close() first",
            errors.FailedPreconditionError.status)
    state = fp32_state_dict_from_checkpoint(directory, tag)
    model = model.cpu()
    model.load_state_dict(state, strict=False)
    return model
