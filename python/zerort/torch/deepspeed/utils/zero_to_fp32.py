"""deepspeed.utils.zero_to_fp32's calls over zerort.torch's checkpoints (_consolidated.py):
the model's full fp32 state dict from a checkpoint saved at any stage and world size, in one
process with no engine and no ranks.

    from zerort.torch.deepspeed.utils.zero_to_fp32 import (
        get_fp32_state_dict_from_zero_checkpoint)      # was: from deepspeed.utils...
    state_dict = get_fp32_state_dict_from_zero_checkpoint("checkpoints")

As a program (DeepSpeed's zero_to_fp32.py script):

    python3 -m zerort.torch.deepspeed.utils.zero_to_fp32 checkpoints pytorch_model.bin
"""
import argparse
import os
import sys

from .... import errors
from ..._consolidated import (fp32_state_dict_from_checkpoint, load_fp32_state_dict,
                              save_fp32_state_dict)

__all__ = ["get_fp32_state_dict_from_zero_checkpoint",
           "convert_zero_checkpoint_to_fp32_state_dict", "load_state_dict_from_zero_checkpoint"]


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag=None,
                                             exclude_frozen_parameters=False,
                                             lazy_mode=False):
    """{name: fp32 tensor} of the checkpoint in `checkpoint_dir` (the one its `latest`
    names, or `checkpoint_dir/tag`): params (tied names share one tensor) and the module
    buffers saved with them (_consolidated.fp32_state_dict_from_checkpoint). `lazy_mode`
    (DeepSpeed's tensors read on first use) is named as unsupported."""
    if lazy_mode:
        raise errors.UnimplementedError(
            "zerort.torch: get_fp32_state_dict_from_zero_checkpoint(lazy_mode=True) is not "
            "supported: the values are read at once (zero-ckpt consolidate writes a "
            "safetensors file, which safetensors reads lazily)", errors.UnimplementedError.status)
    return fp32_state_dict_from_checkpoint(checkpoint_dir, tag, exclude_frozen_parameters)


def convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir, output=None, tag=None,
                                               exclude_frozen_parameters=False,
                                               safe_serialization=False, max_shard_size=None,
                                               *, output_dir=None, output_file=None):
    """Writes that state dict with torch.save in one file, whatever `max_shard_size`, and
    returns its path. Where it goes, under either DeepSpeed's name: `output_dir` (newer
    DeepSpeed's; created if missing) gets pytorch_model.bin; `output_file` (older DeepSpeed's)
    or `output` (the second argument) is the file, or an existing directory's
    pytorch_model.bin. `safe_serialization=True` is named as unsupported (zero-ckpt
    consolidate writes safetensors)."""
    del max_shard_size  # one file: nothing is sharded
    if safe_serialization:
        raise errors.UnimplementedError(
            "zerort.torch: convert_zero_checkpoint_to_fp32_state_dict(safe_serialization=True) "
            "is not supported: `zero-ckpt consolidate CHECKPOINT --out model.safetensors` "
            "writes safetensors", errors.UnimplementedError.status)
    given = [value for value in (output, output_dir, output_file) if value is not None]
    if len(given) != 1:
        raise errors.InvalidArgumentError(
            "zerort.torch: convert_zero_checkpoint_to_fp32_state_dict: give one place to "
            "write: output_dir, output_file or the second argument",
            errors.InvalidArgumentError.status)
    target = os.path.join(os.fspath(output_dir), "") if output_dir is not None else given[0]
    return save_fp32_state_dict(checkpoint_dir, target, tag, exclude_frozen_parameters)


def load_state_dict_from_zero_checkpoint(model, checkpoint_dir, tag=None):
    """Loads that state dict into `model` (moved to the CPU; strict=False) and returns it,
    as DeepSpeed's; refused while an open engine drives `model`."""
    return load_fp32_state_dict(model, checkpoint_dir, tag)


def main(argv=None):
    """DeepSpeed's zero_to_fp32.py command line: CHECKPOINT_DIR OUTPUT_FILE [-t TAG]."""
    parser = argparse.ArgumentParser(
        prog="python3 -m zerort.torch.deepspeed.utils.zero_to_fp32",
        description="Writes the fp32 state dict of a zerort.torch checkpoint (any stage and "
                    "world size) with torch.save.")
    parser.add_argument("checkpoint_dir", help="a checkpoint, or a root whose `latest` names one")
    parser.add_argument("output_file", help="the file to write (a directory: its "
                                            "pytorch_model.bin)")
    parser.add_argument("-t", "--tag", default=None, help="the checkpoint under the root to read")
    parser.add_argument("--exclude_frozen_parameters", action="store_true",
                        help="leave frozen params out")
    parser.add_argument("--safe_serialization", action="store_true",
                        help="not supported: zero-ckpt consolidate writes safetensors")
    parser.add_argument("--max_shard_size", default=None, help="ignored: one file is written")
    args = parser.parse_args(argv)
    try:
        path = convert_zero_checkpoint_to_fp32_state_dict(
            args.checkpoint_dir, args.output_file, tag=args.tag,
            exclude_frozen_parameters=args.exclude_frozen_parameters,
            safe_serialization=args.safe_serialization)
    except errors.ZeroError as error:
        print(f"zero_to_fp32: {error}", file=sys.stderr)
        return 1
    print(f"zero_to_fp32: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
