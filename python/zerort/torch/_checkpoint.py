"""The trainer's state inside a ZeroRT checkpoint (the engine's user data, text).

save_checkpoint(client_state=...) takes anything torch.save can store (torch and CUDA RNG
states, tensors, dicts, numbers); it is written with torch.save, base64-encoded and kept in
a small JSON envelope with what the Python side needs back (the optimizer step count and
the loss scale). Checkpoints whose user data is plain JSON (a client_state written before
the envelope existed, or by another front door) still load: the JSON is returned as is.

Loading unpickles the client state (as torch.load does without weights_only): load only
checkpoints you trust.
"""
import base64
import inspect
import io
import json
import os

import torch

FORMAT = "zerort.torch.client_state/1"


def encode(client_state, extras):
    """The user-data text for `client_state` and `extras` (a JSON-serialisable dict)."""
    buffer = io.BytesIO()
    torch.save(client_state if client_state is not None else {}, buffer)
    envelope = {"format": FORMAT, "extras": extras,
                "client_state": base64.b64encode(buffer.getvalue()).decode("ascii")}
    return json.dumps(envelope)


def decode(text):
    """(client_state, extras) from user-data text ("": ({}, {}))."""
    if not text:
        return {}, {}
    value = json.loads(text)
    if not (isinstance(value, dict) and value.get("format") == FORMAT):
        return value, {}  # plain JSON: a checkpoint written before the envelope
    data = io.BytesIO(base64.b64decode(value["client_state"]))
    options = {}
    if "weights_only" in inspect.signature(torch.load).parameters:
        options["weights_only"] = False  # RNG states and the trainer's own objects
    return torch.load(data, **options), value.get("extras", {})


def resolve_latest(directory):
    """The checkpoint directory a load of `directory` reads: directory/<tag> where
    directory/latest names one (a series, save_checkpoint with a tag), else `directory`."""
    directory = os.fspath(directory).rstrip("/") or "/"
    try:
        with open(os.path.join(directory, "latest"), encoding="utf-8") as file:
            tag = file.read().split("\n")[0]  # the first line as it is, as the engine reads it
    except OSError:
        return directory
    return os.path.join(directory, tag) if tag else directory
