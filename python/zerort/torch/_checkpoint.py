"""TorchEngine's checkpoints (save_checkpoint, load_checkpoint), and the model's full state
dict (module_state_dict, DeepSpeed's save_16bit_model).

The engine's checkpoint holds its params and optimizer state; the trainer's state goes in its
user data (text). save_checkpoint(client_state=...) takes anything torch.save can store
(torch and CUDA RNG states, tensors, dicts, numbers); it is written with torch.save,
base64-encoded and kept in a small JSON envelope with what the Python side needs back (the
optimizer step count, the loss scale, and rank 0's persistent module buffers: BatchNorm's
running statistics, as DeepSpeed's checkpoints hold them with the module's state dict).
Checkpoints whose user data is plain JSON (a client_state written before the envelope
existed, or by another front door) still load: the JSON is returned as is.

Loading unpickles the client state (as torch.load does without weights_only): load only
checkpoints you trust.
"""
import base64
import contextlib
import inspect
import io
import json
import os
import warnings

import torch

from .. import core, errors
from ._collective import every_rank_calls
from ._deepspeed_api import refuse_unless_default
from ._device import broadcast_text

FORMAT = "zerort.torch.client_state/1"


def _saved(value):
    """`value` written with torch.save, base64 text."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _loaded(text, map_location=None):
    options = {}
    if "weights_only" in inspect.signature(torch.load).parameters:
        options["weights_only"] = False  # RNG states and the trainer's own objects
    return torch.load(io.BytesIO(base64.b64decode(text)), map_location=map_location, **options)


def encode(client_state, extras, buffers):
    """The user-data text for `client_state`, `extras` (a JSON-serialisable dict) and
    `buffers` ({name: tensor})."""
    envelope = {"format": FORMAT, "extras": extras,
                "client_state": _saved(client_state if client_state is not None else {}),
                "buffers": _saved(buffers)}
    return json.dumps(envelope)


def decode(text):
    """(client_state, extras, buffers) from user-data text ("": ({}, {}, None)); buffers is
    None for a checkpoint written before they were saved."""
    if not text:
        return {}, {}, None
    value = json.loads(text)
    if not (isinstance(value, dict) and value.get("format") == FORMAT):
        return value, {}, None  # plain JSON: a checkpoint written before the envelope
    buffers = _loaded(value["buffers"]) if "buffers" in value else None
    return _loaded(value["client_state"]), value.get("extras", {}), buffers


def saved_module_state(text):
    """What user-data text holds of the module besides the engine's params, without loading
    its client state (which may need the trainer's classes or a GPU): ({name: CPU tensor} of
    the module buffers saved, [names of the frozen params the engine did not keep], {name:
    (shape, frozen)} of the params without elements), empty where the text has none (another
    front door's user data, an older checkpoint)."""
    try:
        value = json.loads(text) if text else None
    except ValueError:
        value = None
    if not (isinstance(value, dict) and value.get("format") == FORMAT):
        return {}, [], {}
    buffers = _loaded(value["buffers"], map_location="cpu") if "buffers" in value else {}
    extras = value.get("extras", {})
    return (buffers, list(extras.get("frozen_not_kept", [])),
            {name: (list(shape), bool(frozen))
             for name, (shape, frozen) in extras.get("empty_params", {}).items()})


def module_state_items(module, prefix=""):
    """(name, tensor, is_param) for every entry of module.state_dict(), in its order: each
    module's params, then its persistent buffers, then its children's (a param or module
    shared under several names once per name)."""
    for name, param in module._parameters.items():
        if param is not None:
            yield prefix + name, param, True
    for name, buffer in module._buffers.items():
        if buffer is not None and name not in module._non_persistent_buffers_set:
            yield prefix + name, buffer, False
    for name, child in module._modules.items():
        if child is not None:
            yield from module_state_items(child, prefix + name + ".")


def restore_buffers(module, saved):
    """Copies the checkpoint's buffers `saved` ({name: tensor}) into `module`'s persistent
    buffers of the same names; warns about names on one side only or shapes that differ."""
    own = {name: tensor for name, tensor, is_param in module_state_items(module) if not is_param}
    skipped = sorted(set(saved) ^ set(own))
    with torch.no_grad():
        for name, value in saved.items():
            buffer = own.get(name)
            if buffer is None:
                continue
            if buffer.shape != value.shape:
                skipped.append(name)
                continue
            buffer.copy_(value)
    if skipped:
        warnings.warn("zerort.torch: load_checkpoint(): these module buffers were not "
                      "restored (in the checkpoint or the model only, or of another shape): "
                      + ", ".join(skipped), stacklevel=3)


def resolve_latest(directory, warn=True):
    """The checkpoint directory a load of `directory` reads, as the library resolves it
    (core.resolve_checkpoint): directory/<tag> where directory/latest names one, directory
    itself when it holds meta.json, and the newest checkpoint in it when a series' first save
    stopped before writing `latest` (said in a warning, if `warn`); a damaged `latest` as it
    is (the load names what is wrong)."""
    directory = os.fspath(directory).rstrip("/") or "/"
    try:
        resolved = core.resolve_checkpoint(directory)
    except errors.ZeroError:
        return directory
    if warn and resolved != directory and not os.path.exists(os.path.join(directory, "latest")):
        warnings.warn(f"zerort.torch: {directory} has no `latest` file (the job stopped right "
                      f"after its first save): loading its newest checkpoint, {resolved}",
                      stacklevel=3)
    return resolved


class CheckpointMethods:
    """TorchEngine's checkpoints, as DeepSpeed's engine names them: save_checkpoint,
    load_checkpoint, and preemption_requested for jobs that save before they are stopped;
    the model's full state dict (module_state_dict, save_16bit_model)."""

    def module_state_dict(self, exclude_frozen_parameters=False):
        """The model's state dict with full values: model.state_dict()'s own walk (a tied
        param under each of its names, the persistent buffers, extra state, what a module's
        _save_to_state_dict or state-dict hooks add) with each param's full value; a file of
        it loads with model.load_state_dict() into the same model built without an engine
        (at stage 3, model.state_dict() is refused between uses). Copies, on the params'
        device, in their dtype. Collective at stage 3: every rank calls it, and gets it
        (DeepSpeed's _zero3_consolidated_16bit_state_dict). `exclude_frozen_parameters`:
        without the params that do not train (a LoRA model's base)."""
        full = self.state_dict()  # each registered param once (collective)
        values = {id(param): full[name] for name, param, _ in self._params + self._frozen}
        values.update((id(param), full[name]) for name, param in self._empty)
        if self._units is not None:  # a sharded param's entry is replaced below
            self._units.refuse_state_dict = False
        try:  # the module's own walk: extra state, _save_to_state_dict overrides, hooks
            entries = self.module.state_dict(keep_vars=True)
        finally:
            if self._units is not None:
                self._units.refuse_state_dict = True
        result = type(entries)()
        for name, entry in entries.items():
            if isinstance(entry, torch.nn.Parameter):
                if exclude_frozen_parameters and not entry.requires_grad:
                    continue
                value = values.get(id(entry))
                if value is not None:
                    result[name] = value
                    continue
            elif isinstance(entry, torch.Tensor) and self._units is not None:
                value = self._full_value_behind(name, entry, full)
                if value is not None:
                    result[name] = value
                    continue
            result[name] = entry.detach().clone() if isinstance(entry, torch.Tensor) else entry
        if hasattr(entries, "_metadata"):
            result._metadata = entries._metadata  # module versions, as state_dict() keeps
        return result

    def _full_value_behind(self, name, entry, full):
        """Stage 3: the full value of the sharded param whose placeholder the state-dict
        entry `name` views (a _save_to_state_dict override that writes param.detach()),
        from `full` (state_dict()); None when it views none. A view of it in another shape
        is refused: its values would be the placeholder's NaN. Not told apart (limits): a
        square param's transposed view (taken as the param) and a value computed into new
        memory (param.detach() * 2: NaN); such overrides save right inside gathered()."""
        pid = self._units.released_param_viewed_by(entry)
        if pid is None:
            return None
        param_name = self._records[pid].name
        if entry.shape == full[param_name].shape:
            return full[param_name]
        raise errors.FailedPreconditionError(
            f"zerort.torch: module_state_dict(): entry \"{name}\" is computed from param "
            f"\"{param_name}\", which is sharded between uses at stage 3 (a _save_to_state_dict "
            "override or state-dict hook that reads it): its values would be NaN. Save inside "
            "`with zerort.torch.gathered(list(model.parameters())):` with model.state_dict().",
            errors.FailedPreconditionError.status)

    def load_module_state_dict(self, checkpoint, strict=True, custom_load_fn=None,
                               fetch_z3_params=False):
        """Loads a full state dict (a pretrained model's, module_state_dict()'s, a file of
        model.state_dict()) into the model, as model.load_state_dict(checkpoint, strict)
        would, at every stage: one module at a time, inside gathered(its own params,
        modifier_rank=0), so at stage 3 no rank holds more than one module's params whole
        (a frozen LoRA base too), and the engine takes the values (fp32 masters, moments
        kept). `checkpoint` is the state dict, or DeepSpeed's checkpoint dict holding it
        under "module". Collective: every rank calls it with the same state dict (rank 0's
        param values are the ones loaded; each rank loads its own buffers), between steps.
        Returns PyTorch's (missing_keys, unexpected_keys); with `strict`, either raises on
        every rank, as PyTorch's, after the keys that match are loaded. DeepSpeed's
        `fetch_z3_params` is accepted (gathering is what this does); `custom_load_fn` is
        named as unsupported."""
        refuse_unless_default("load_module_state_dict", {"custom_load_fn": custom_load_fn}, {
            "custom_load_fn": (None, "load the module's params with the state dict itself")})
        del fetch_z3_params  # every module's params are gathered, one module at a time
        self._check_model("load_module_state_dict()")
        state_dict = checkpoint
        if isinstance(checkpoint, dict) and isinstance(checkpoint.get("module"), dict):
            state_dict = checkpoint["module"]  # DeepSpeed's checkpoint dict
        metadata = getattr(state_dict, "_metadata", None)
        missing, unexpected, messages = [], [], []
        if self._units is not None:
            self._units.refuse_state_dict = False  # the model's pre-hook: loaded gathered here
        try:
            with every_rank_calls("load_module_state_dict()"):
                self._load_module(self.module, state_dict, "", metadata,
                                  (missing, unexpected, messages))
        finally:
            if self._units is not None:
                self._units.refuse_state_dict = True
        if strict and missing:  # PyTorch's order: unexpected keys, missing keys, then the rest
            messages.insert(0, "Missing key(s) in state_dict: "
                            + ", ".join(f'"{key}"' for key in missing))
        if strict and unexpected:
            messages.insert(0, "Unexpected key(s) in state_dict: "
                            + ", ".join(f'"{key}"' for key in unexpected))
        if messages:
            raise RuntimeError(f"Error(s) in loading state_dict for "
                               f"{type(self.module).__name__}:\n\t" + "\n\t".join(messages))
        return torch.nn.modules.module._IncompatibleKeys(missing, unexpected)

    def _load_module(self, module, state_dict, prefix, metadata, found):
        """load_module_state_dict() for `module` (its own params gathered) and its subtree;
        `found`: PyTorch's (missing keys, unexpected keys, error messages) lists."""
        local_metadata = {} if metadata is None else metadata.get(prefix[:-1], {})
        own = [param for param in module._parameters.values() if param is not None]
        with self.gathered(own, modifier_rank=0) if own else contextlib.nullcontext():
            module._load_from_state_dict(state_dict, prefix, local_metadata, True, *found)
        for name, child in module._modules.items():
            if child is not None:
                self._load_module(child, state_dict, prefix + name + ".", metadata, found)
        keys = torch.nn.modules.module._IncompatibleKeys(*found[:2])
        for hook in getattr(module, "_load_state_dict_post_hooks", {}).values():
            hook(module, keys)

    def _zero3_consolidated_16bit_state_dict(self, exclude_frozen_parameters=False):
        """DeepSpeed's name for module_state_dict(), which Accelerate calls."""
        return self.module_state_dict(exclude_frozen_parameters)

    def save_16bit_model(self, save_dir, save_filename="pytorch_model.bin",
                         exclude_frozen_parameters=False):
        """DeepSpeed's: rank 0 writes module_state_dict() with torch.save to
        save_dir/save_filename (written whole, then renamed into place). Collective at stage
        3. Returns True."""
        state = self.module_state_dict(exclude_frozen_parameters)
        if self.rank == 0:
            os.makedirs(save_dir, exist_ok=True)
            path = os.path.join(save_dir, save_filename)
            torch.save(state, path + ".tmp")
            os.replace(path + ".tmp", path)
        return True

    def save_fp16_model(self, save_dir, save_filename="pytorch_model.bin"):
        """DeepSpeed's older name for save_16bit_model (older Hugging Face and Megatron
        scripts call it)."""
        return self.save_16bit_model(save_dir, save_filename)

    def save_checkpoint(self, directory, tag=None, client_state=None, save_latest=True):
        """Every rank saves its part; loadable at any world size and stage. As DeepSpeed's
        save_checkpoint(save_dir, tag): into directory/tag (tag "global_step<N>" when none
        is given, N = global_steps), then directory/latest names it and only the newest
        `checkpoint.keep_last` stay; what else `directory` holds is left alone. The engine
        saves every group's hyperparameters (engine.optimizer.param_groups' values now) and
        the config schedule's position.
        `client_state` (anything torch.save stores: data position, torch.get_rng_state(),
        tensors; rank 0's is kept) is saved inside the same checkpoint, as DeepSpeed's
        client_state, so it can never disagree with it (_checkpoint.py), with rank 0's
        persistent module buffers (BatchNorm's running statistics). `save_latest`:
        DeepSpeed's, True only (a tagged save always points directory/latest at itself)."""
        refuse_unless_default("save_checkpoint", {"save_latest": save_latest}, {
            "save_latest": (True, "a tagged save always points directory/latest at itself "
                                  "once it is complete")})
        self._check_model("save_checkpoint()")
        if self._micro_batches or self._handed_since_step_call or self._window_ended:
            gas = int(self.gradient_accumulation_steps)
            raise errors.FailedPreconditionError(
                "zerort.torch: save_checkpoint(): "
                f"{gas if self._window_ended else self._micro_batches} of "
                f"{self.gradient_accumulation_steps} micro-batches of the next optimizer step "
                "have run" + (" (and a backward since)" if self._handed_since_step_call else "")
                + ": the engine holds their gradients, which a checkpoint does not keep. Save "
                "at an accumulation boundary, right after the step() that steps the optimizer "
                "(engine.is_gradient_accumulation_boundary() is true before it).",
                errors.FailedPreconditionError.status)
        if self._between_steps():
            self._take_written_params()
        self.optimizer.push()  # the groups' values as they are now (a scheduler's new lr)
        extras = {"global_steps": self.global_steps, "skipped_steps": self.skipped_steps,
                  "loss_scale": self.loss_scale}
        if self._driven_scheduler is not None:  # DeepSpeed's client scheduler: saved too
            extras["lr_scheduler"] = _saved(self._driven_scheduler.state_dict())
        kept = {id(param) for _, param, _ in self._frozen}
        extras["frozen_not_kept"] = [name for name, param in self._inventory.frozen
                                     if id(param) not in kept]  # named by zero_to_fp32
        extras["empty_params"] = {name: [list(tensor.shape), not tensor.requires_grad]
                                  for name, tensor, is_param in module_state_items(self.module)
                                  if is_param and tensor.numel() == 0}  # [shape, frozen]
        buffers = {name: tensor.detach().cpu().clone()
                   for name, tensor, is_param in module_state_items(self.module) if not is_param}
        self._engine.set_checkpoint_user_data(encode(client_state, extras, buffers))
        with every_rank_calls("engine.save_checkpoint()", "; each rank saves its own part"):
            self._engine.save_checkpoint(
                directory, f"global_step{self.global_steps}" if tag is None else tag)

    def _every_rank_finds_a_checkpoint(self, directory):
        """Whether `directory` holds a checkpoint (meta.json) or a latest file on every
        rank (collective: every rank takes the same way)."""
        found = (os.path.isfile(os.path.join(directory, "latest"))
                 or os.path.isfile(os.path.join(resolve_latest(directory, warn=False),
                                                "meta.json")))
        flag = torch.tensor([1.0 if found else 0.0])
        with every_rank_calls("engine.load_checkpoint()"):
            return self.all_reduce(flag, "min").item() == 1.0

    def _load_weights(self, path, strict):
        """load_checkpoint(load_module_only=True) of checkpoint `path`; returns its client
        state."""
        if self._micro_batches or self._handed_since_step_call or self._window_ended:
            raise errors.FailedPreconditionError(
                "zerort.torch: load_checkpoint(load_module_only=True) inside an accumulation "
                "window: gradients of the next step have arrived, computed with the weights "
                "it would replace. Load at an accumulation boundary, right after the step() "
                "that steps the optimizer, or before the first forward",
                errors.FailedPreconditionError.status)
        # Everything that can fail before a weight changes: rank 0's read and check of the
        # checkpoint, then every rank's decoding of the client state rank 0 read there.
        readers, reader, text, failure = {}, None, "", None  # readers: {name: (reader, index)}
        try:
            if self.rank == 0:
                reader = core.CheckpointReader(path)
                text = reader.user_data
                readers = self._check_weights(reader, strict)
        except Exception as error:  # noqa: BLE001 - every rank raises it below
            failure = error
        self._agree_or_raise(failure, f"another rank could not read {path}")
        try:
            client_state, _, buffers = decode(broadcast_text(self._comm, text, 0, self._timeout))
        except Exception as error:  # noqa: BLE001 - every rank raises it below
            failure = error
        self._agree_or_raise(failure, f"another rank could not decode {path}'s client state")
        names = self._weights_to_load()
        with reader if reader is not None else contextlib.nullcontext():
            seen = set()
            for module in self.module.modules():
                chunk = [p for p in module.parameters(recurse=False)
                         if id(p) not in seen and id(p) in names]
                seen.update(id(p) for p in chunk)
                if not chunk:
                    continue
                values, failure = {}, None
                try:  # rank 0 reads the module's values first: an I/O error stops every rank
                    for param in chunk:
                        found = readers.get(names[id(param)])
                        if found is not None:
                            values[id(param)] = torch.empty(param.shape, dtype=torch.float32)
                            found[0].read_param(found[1], values[id(param)].data_ptr())
                except Exception as error:  # noqa: BLE001 - every rank raises it below
                    failure = error
                self._agree_or_raise(failure, f"rank 0 could not read {path} (the modules "
                                     "before this one are loaded)")
                with self.gathered(chunk, modifier_rank=0), torch.no_grad():
                    for param in chunk:
                        if id(param) in values:
                            param.copy_(values[id(param)])
        if buffers is not None:
            restore_buffers(self.module, buffers)
        return client_state

    def _agree_or_raise(self, failure, otherwise):
        """Raises on every rank when `failure` (an exception or None) is set on any rank:
        rank 0's where it has one, as _raise_everywhere. Collective."""
        if self._any_rank(failure is not None):
            self._raise_everywhere(failure, "zerort.torch: load_checkpoint(load_module_only="
                                   f"True): {otherwise} (its error says why)")

    def _raise_everywhere(self, failure, otherwise):
        """Raises rank 0's `failure` on every rank (a ZeroError's class and message; another
        exception as InvalidArgumentError naming it on the other ranks); where rank 0 has
        none, each rank its own, or AbortedError(`otherwise`). Collective."""
        text = ""
        if self.rank == 0 and failure is not None:
            status = getattr(failure, "status", errors.InvalidArgumentError.status)
            message = getattr(failure, "message", f"{type(failure).__name__}: {failure}")
            text = json.dumps({"status": status, "message": message})
        text = broadcast_text(self._comm, text, 0, self._timeout)
        if text and (failure is None or self.rank != 0):
            first = json.loads(text)
            raise errors.error_for(first["status"], first["message"])
        if failure is not None:
            raise failure
        raise errors.AbortedError(otherwise, errors.AbortedError.status)

    def _weights_to_load(self):
        """{id(param): its name} for every float param of the model with elements that a
        weights-only load sets (the engine's, and frozen ones it does not keep)."""
        names = {id(param): name for name, param, _ in self._params + self._frozen}
        for name, param in self._inventory.frozen:
            names.setdefault(id(param), name)
        return names

    def _check_weights(self, reader, strict):
        """Rank 0's check of a weights-only load from `reader`: every record intact, every
        param the engine steps there with its shape (strict: and no other); returns {name:
        (reader, index)} of the params to read."""
        reader.verify()
        found = {}
        for index, saved in enumerate(reader.params):
            if saved["saved"]:
                for name in [saved["name"]] + saved["aliases"]:
                    found[name] = (reader, index, saved["shape"])
        wanted = self._weights_to_load()
        trainable = {id(param) for _, param, _ in self._params}
        params = {id(p): p for p in self.module.parameters()}
        problems = []
        for key, name in wanted.items():
            entry = found.get(name)
            if entry is None:
                if key in trainable and strict:
                    problems.append(f"{name} is not in it")
            elif list(entry[2]) != list(params[key].shape):
                problems.append(f"{name} is {tuple(entry[2])} there and "
                                f"{tuple(params[key].shape)} here")
        if strict:  # every name of the model's params counts (a tied weight's other names)
            model_names = {name for name, _, is_param in module_state_items(self.module)
                           if is_param}
            extra = sorted(set(found) - model_names)
            problems += [f"{name} is there and not in the model" for name in extra[:5]]
        if problems:
            raise errors.InvalidArgumentError(
                "zerort.torch: load_checkpoint(load_module_only=True): "
                f"{reader.description['dir']} does not fit the model: " + "; ".join(problems[:5])
                + ". Nothing was loaded"
                + (" (load_module_strict=False loads the params the two share)" if strict else ""),
                errors.InvalidArgumentError.status)
        return {name: (entry[0], entry[1]) for name, entry in found.items()}

    def preemption_requested(self):
        """After zerort.install_preemption_handler(): whether any rank got SIGTERM or
        SIGUSR1. Collective (every rank calls it at the same step); the same answer on
        every rank, so all of them save and exit together."""
        return self._engine.preemption_requested()

    def load_checkpoint(self, directory, tag=None, load_module_strict=True,
                        load_optimizer_states=True, load_lr_scheduler_states=True,
                        load_module_only=False):
        """Loads params, optimizer state, every group's hyperparameters, the config
        schedule's position and the module's persistent buffers (the model's params and
        engine.optimizer.param_groups show the loaded values) from `directory`
        (directory/tag with a tag), or from the checkpoint directory/latest names. Returns,
        as DeepSpeed's load_checkpoint does, (the path of the checkpoint loaded, the
        client_state saved with it ({} if none)). Without a tag, a `directory` that holds
        no checkpoint and no latest file on some rank (the first launch of a job that
        resumes when it can) loads nothing on every rank and returns (None, None) with a
        warning, as DeepSpeed does. Unpickles the client state: load only checkpoints you
        trust. DeepSpeed's keyword arguments are taken at their defaults only (a ZeroRT
        checkpoint loads whole; load_module_strict=False is taken too, as every param the
        engine holds is in a checkpoint of the same model, which a load checks).

        `load_module_only=True` (or both load_optimizer_states and load_lr_scheduler_states
        False), as DeepSpeed's: the weights alone (each param's saved fp32 value, and the
        module buffers), the optimizer state, step counts and schedule staying this engine's
        (a fine-tune that starts from another run's weights; any stage and world size; a
        16-bit param's fp32 master takes its 16-bit value, as DeepSpeed's module-only load
        leaves it). Rank 0 checks the whole checkpoint first (every checksum; every param the
        engine drives there, of its shape, and nothing else unless `load_module_strict` is
        False), and every rank decodes its client state, so a refused load changes nothing;
        then rank 0 reads one module's params at a time and every rank takes them
        (gathered(modifier_rank=0)); a read that fails there (the disk) stops every rank,
        with the modules before loaded. Frozen params the checkpoint does not hold keep
        their values."""
        weights_only = load_module_only or not (load_optimizer_states or load_lr_scheduler_states)
        if not weights_only:
            refuse_unless_default("load_checkpoint", {
                "load_optimizer_states": load_optimizer_states,
                "load_lr_scheduler_states": load_lr_scheduler_states}, {
                "load_optimizer_states": (True, "the schedule without the optimizer state "
                                          "does not load; pass load_lr_scheduler_states=False "
                                          "too (the weights alone) or neither"),
                "load_lr_scheduler_states": (True, "the optimizer state without the schedule "
                                             "does not load; a ZeroRT checkpoint restores "
                                             "both, or pass load_module_only=True")})
        self._check_model("load_checkpoint()")
        if tag is None and not self._every_rank_finds_a_checkpoint(directory):
            warnings.warn(
                f"zerort.torch: load_checkpoint(): {directory} holds no checkpoint and no "
                "latest file naming one (on this rank or another); nothing loaded (DeepSpeed: "
                "\"Unable to find latest file\"). Pass a tag to load a checkpoint by name",
                stacklevel=2)
            return None, None
        if tag is not None:
            directory = f"{directory}/{tag}"
        loaded_path = resolve_latest(directory)
        if weights_only:
            return loaded_path, self._load_weights(loaded_path, load_module_strict)
        with every_rank_calls("engine.load_checkpoint()"):
            self._engine.load_checkpoint(directory)
        text = self._engine.checkpoint_user_data()
        if self._units is None:
            self._bind_views()
        client_state, extras, buffers = decode(text)
        if buffers is not None:
            restore_buffers(self.module, buffers)
        self.global_steps = int(extras.get("global_steps", self.global_steps))
        self.skipped_steps = int(extras.get("skipped_steps", self.skipped_steps))
        if self._driven_scheduler is not None and "lr_scheduler" in extras:
            self._driven_scheduler.load_state_dict(_loaded(extras["lr_scheduler"]))
        elif self._driven_scheduler is not None or "lr_scheduler" in extras:
            warnings.warn(
                f"zerort.torch: load_checkpoint(): {loaded_path} was saved "
                + ("without an lr scheduler, so this engine's starts again from its first "
                   "step" if self._driven_scheduler is not None else
                   "with an lr scheduler, which this engine has not (drive_lr_scheduler): "
                   "its position is not restored"), stacklevel=2)
        # The engine's: a checkpoint's dynamic scale reaches only an engine that scales
        # dynamically (a static or no loss scale stays what this config says).
        self._loss_scale = self._engine.loss_scale
        self.optimizer.pull()
        return loaded_path, client_state
