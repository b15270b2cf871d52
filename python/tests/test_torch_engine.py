"""zerort.torch against single-process PyTorch, with real autograd, on in-process ranks.

Each rank is a thread with its own copy of the model (same seed), its own engine and its half
of every batch; the reference is one plain PyTorch model trained on the whole batch with
torch.optim.AdamW. Final params must agree to a relative error of 1e-5 (fp32).
"""
import os
import signal
import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize
from torch.utils.checkpoint import checkpoint

import zerort
import zerort.torch
from zerort.torch._params import storage_bytes

VOCAB, DIM, RANK, BATCH, SEQ, STEPS = 11, 16, 4, 8, 5, 12
OPTIMIZER = {"type": "adamw", "lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-8,
             "weight_decay": 0.01}


class LoraBlock(nn.Module):
    """A residual block: a frozen base projection plus a trainable low-rank adapter."""

    def __init__(self, shared_a=None):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.base = nn.Linear(DIM, DIM)
        self.base.requires_grad_(False)
        self.lora_a = shared_a if shared_a is not None else nn.Linear(DIM, RANK, bias=False)
        self.lora_b = nn.Linear(RANK, DIM, bias=False)

    def forward(self, x):
        h = self.norm(x)
        return x + torch.tanh(self.base(h) + self.lora_b(self.lora_a(h)))


class TinyLM(nn.Module):
    """Frozen embeddings, two LoRA blocks (optionally checkpointed), a trainable head."""

    def __init__(self, share_adapter=False, reentrant=False, input_requires_grad=False,
                 branch=False, non_reentrant=False, scalar=False):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, DIM)
        self.embed.requires_grad_(False)
        first = LoraBlock()
        self.blocks = nn.ModuleList([first, LoraBlock(first.lora_a if share_adapter else None)])
        self.head = nn.Linear(DIM, VOCAB)
        self.branch = nn.Linear(DIM, DIM) if branch else None
        self.temperature = nn.Parameter(torch.tensor(1.5)) if scalar else None  # 0-dim
        self.non_reentrant = non_reentrant
        self.reentrant = reentrant
        self.input_requires_grad = input_requires_grad

    def forward(self, tokens, use_branch=True):
        return self.logits(tokens, use_branch)

    def logits(self, tokens, use_branch=True):
        """The forward's computation, as another method (CLIP's encode_text): a trainer may
        call it instead of the model, so that the model's own forward never runs."""
        x = self.embed(tokens)
        if self.input_requires_grad:
            x = x.detach().requires_grad_()
        for block in self.blocks:
            if self.reentrant or self.non_reentrant:
                x = checkpoint(block, x, use_reentrant=self.reentrant)
            else:
                x = block(x)
        if self.branch is not None and use_branch:
            x = x + torch.tanh(self.branch(x))
        logits = self.head(x)
        return logits / self.temperature if self.temperature is not None else logits


def batch(step):
    generator = torch.Generator().manual_seed(100 + step)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
    targets = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
    return tokens, targets


def micro_batch(seed, world, accumulation, rows, step, micro, rank):
    """The `rows` rows rank `rank` of `world` trains on in micro-batch `micro` of step `step`
    (`accumulation` micro-batches per step): a fresh batch per (seed, step, micro, rank)."""
    tokens, targets = batch(seed + world * (accumulation * step + micro) + rank)
    return tokens[:rows], targets[:rows]


def loss_of(model, tokens, targets, use_branch=True, via_method=False):
    logits = model.logits(tokens, use_branch) if via_method else model(tokens, use_branch)
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def reference(device="cpu", **model_options):
    """Single-process PyTorch on the whole batch."""
    model = TinyLM(**model_options).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=OPTIMIZER["lr"], betas=OPTIMIZER["betas"],
                                  eps=OPTIMIZER["eps"], weight_decay=OPTIMIZER["weight_decay"])
    for step in range(STEPS):
        optimizer.zero_grad()
        loss_of(model, *(t.to(device) for t in batch(step))).backward()
        optimizer.step()
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def run_ranks(world, body, raise_first=True):
    """Runs body(rank, comm) on `world` in-process ranks; returns the results, or raises the
    first rank's exception once every rank has finished (raise_first=False: returns the
    results and the exceptions, per rank)."""
    comms = zerort.local_group(world)
    results, failures = [None] * world, [None] * world

    def run(rank):
        try:
            results[rank] = body(rank, comms[rank])
        except Exception as error:  # noqa: BLE001 - reported to the test below
            failures[rank] = error

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if not raise_first:
        return results, failures
    for failure in failures:
        if failure is not None:
            raise failure
    return results


def skips_branch(rank, step):
    """The branch that rank 1 skips on odd steps."""
    return rank == 1 and step % 2 == 1


def train_sharded(stage, world=2, guard=None, raise_first=True, steps=range(STEPS),
                  load=None, save=None, perturb=False, perturb_frozen=False,
                  preempt_at=None, device="cpu", via_method=False, **model_options):
    """Trains on `world` in-process ranks; optionally loads a checkpoint first and saves one
    after. With `preempt_at`, rank 0 sends itself SIGUSR1 after that step; every rank
    polls preemption_requested() after each step and, once it is true, saves the checkpoint
    `save`/step-N and stops. Rows are split as evenly as `world` allows, each rank's loss
    weighted so that the ranks' averaged gradients are the whole batch's. `device`: where
    the models and batches live ("cuda": the engines run on the GPU). `via_method`: the
    ranks compute through TinyLM.logits, never calling the model itself."""
    config = {"stage": stage, "optimizer": OPTIMIZER, "stage3": {"persistence_threshold": 0},
              "buckets": {"first_bucket_elems": 64, "reduce_bucket_elems": 256},
              "guard": dict({"timeout_s": 30}, **(guard or {}))}

    # Built here, not in the rank threads: TinyLM seeds PyTorch's global generator.
    models = [TinyLM(**model_options).to(device) for _ in range(world)]
    if perturb:  # every rank but 0 starts its trainable params from other values
        with torch.no_grad():
            for model in models[1:]:
                for param in model.parameters():
                    if param.requires_grad:
                        param.add_(0.1)
    bounds = [BATCH * r // world for r in range(world + 1)]
    if perturb_frozen:  # every rank but 0 loads other frozen weights and buffers
        with torch.no_grad():
            for rank, model in enumerate(models):
                model.register_buffer("scale_buffer", torch.full((3,), float(rank)))
                if rank > 0:
                    for param in model.parameters():
                        if not param.requires_grad:
                            param.mul_(1.5)

    def body(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, config, comm)
        if load is not None:
            path, client_state = engine.load_checkpoint(load)
            assert client_state == {"next_step": steps[0]}
            assert os.path.isfile(os.path.join(path, "meta.json"))  # the checkpoint itself
        mine = slice(bounds[rank], bounds[rank + 1])
        weight = (bounds[rank + 1] - bounds[rank]) * world / BATCH
        preempted = False
        for step in steps:
            tokens, targets = (t.to(device) for t in batch(step))
            loss = loss_of(model, tokens[mine], targets[mine], not skips_branch(rank, step),
                           via_method)
            (weight * loss).backward()
            engine.step()
            if preempt_at is None:
                continue
            if rank == 0 and step == preempt_at:
                # To this thread: handled before the call returns (os.kill's may land
                # on any thread, later).
                signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
            if engine.preemption_requested():
                engine.save_checkpoint(save, tag=f"step-{step + 1}",
                                       client_state={"next_step": step + 1})
                preempted = True
                break
        if save is not None and not preempted:
            engine.save_checkpoint(save, client_state={"next_step": steps[-1] + 1})
        engine.close()  # the model keeps the final values (stage 3: gathered back)
        return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    return run_ranks(world, body, raise_first)


def assert_close(got, want):
    assert got.keys() == want.keys()
    for name in want:
        scale = max(want[name].abs().max().item(), 1e-3)
        error = (got[name] - want[name]).abs().max().item() / scale
        assert error <= 1e-5, f"{name}: relative error {error:.2e}"


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_lora_model_matches_single_process_pytorch(stage):
    want = reference()
    for trained in train_sharded(stage):
        assert_close(trained, want)


def test_frozen_params_are_not_registered():
    comm = zerort.local_group(1)[0]
    model = TinyLM()
    engine = zerort.torch.initialize(model, {"stage": 2}, comm)
    names = set(engine.state_dict())
    assert "embed.weight" not in names and "blocks.0.base.weight" not in names
    assert "blocks.0.lora_a.weight" in names and "head.weight" in names
    engine.close()


def test_params_are_views_of_the_engine():
    """Stages 0-2: no copy back after a step; the torch param is the engine's memory."""
    comm = zerort.local_group(1)[0]
    model = TinyLM()
    engine = zerort.torch.initialize(model, {"stage": 1, "optimizer": OPTIMIZER}, comm)
    before = model.head.weight.detach().clone()
    loss_of(model, *batch(0)).backward()
    engine.step()
    assert not torch.equal(model.head.weight, before)
    assert torch.equal(model.head.weight, engine.state_dict()["head.weight"])
    engine.close()


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_reentrant_checkpoint_with_frozen_inputs_names_the_adapters(stage):
    """use_reentrant=True around blocks whose input needs no grad: PyTorch gives the adapters
    no gradient, silently; ZeroRT says so and names them."""
    with pytest.raises(zerort.UnusedParametersError) as raised:
        train_sharded(stage, reentrant=True)
    message = str(raised.value)
    assert "blocks.0.lora_a.weight" in message
    assert "use_reentrant=False" in message and "requires_grad" in message


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_shared_adapter_under_reentrant_checkpoint(stage):
    """The adapter shared by both checkpointed blocks gets one gradient per block. At stage 3
    the recomputed forward inside backward gathers its unit again."""
    options = {"share_adapter": True, "reentrant": True, "input_requires_grad": True}
    want = reference(**options)
    try:
        results = train_sharded(stage, **options)
    except zerort.DuplicateGradientError as error:  # the default guard: an error, or ...
        assert "blocks.0.lora_a.weight" in str(error)
    else:  # ... the right numbers, never wrong ones
        for trained in results:
            assert_close(trained, want)
    for trained in train_sharded(stage, guard={"on_duplicate": "count"}, **options):
        assert_close(trained, want)


@pytest.mark.parametrize("prefetch_elems", [0, 50_000_000])
def test_stage3_gathers_into_the_params_storage_and_frees_it_after(prefetch_elems):
    """Between uses a param's unit has no storage (the param reads as NaN, a placeholder
    of its shape). A gather writes straight into the storage the module computes with (the
    engine's view of the param is the param's own memory), and the engine allocates no
    gathered buffer of its own, prefetching or not."""
    comm = zerort.local_group(1)[0]
    model = TinyLM()
    engine = zerort.torch.initialize(
        model, {"stage": 3, "optimizer": OPTIMIZER,
                "stage3": {"persistence_threshold": 0, "prefetch_elems": prefetch_elems}},
        comm)
    pid = next(p for name, _, p in engine._params if name == "head.weight")

    def released():
        flat = engine._units._flats[engine._records[pid].unit]
        return storage_bytes(flat) == 0 and bool(torch.isnan(model.head.weight).all())

    assert released()  # between uses: no storage
    seen = []
    model.head.register_forward_pre_hook(lambda module, _: seen.append(
        (module.weight.data_ptr(), engine.engine.param_data(pid))))
    for step in range(3):
        loss_of(model, *batch(step)).backward()
        engine.step()
    assert seen and all(ours == engines for ours, engines in seen), seen
    assert engine.counters()["gather_allocations"] == 0
    current, peak = engine.engine.memory_stats()["gathered"]
    assert current == 0 and peak > 0  # counted while lent, all of it given back
    assert released()
    full = engine.state_dict()["head.weight"]
    engine.close()  # every param gets its full value back
    assert torch.equal(model.head.weight.detach(), full)


@pytest.mark.parametrize("world", [1, 3])
def test_checkpoint_from_two_ranks_stage2_resumes_at_stage3(tmp_path, world):
    """Saved at 2 ranks, stage 2, halfway; resumed at `world` ranks, stage 3: the same
    result as the uninterrupted run."""
    half = STEPS // 2
    train_sharded(2, world=2, steps=range(half), save=tmp_path / "ckpt")
    for trained in train_sharded(3, world=world, steps=range(half, STEPS),
                                 load=tmp_path / "ckpt"):
        assert_close(trained, reference())


def test_preempted_run_saves_at_a_step_boundary_and_resumes_from_latest(tmp_path):
    """SIGUSR1 after step 4: both ranks save step-5 and stop; resumed from the series root
    (its `latest`), the result equals the uninterrupted run."""
    zerort.install_preemption_handler()
    try:
        train_sharded(2, steps=range(STEPS), save=tmp_path, preempt_at=4)
    finally:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert (tmp_path / "latest").read_text().strip() == "step-5"
    for trained in train_sharded(2, steps=range(5, STEPS), load=tmp_path):
        assert_close(trained, reference())


def cpu_supports(dtype):
    """Whether this PyTorch runs the test model in `dtype` on the CPU (fp16 needs 2.x)."""
    try:
        loss_of(TinyLM().to(dtype), *batch(0)).backward()
    except RuntimeError:
        return False
    return True


class Upcast(nn.Module):
    """A parametrization: the param stored in 16 bits, the layer computing with its fp32 value."""

    def forward(self, stored):
        return stored.float()


def stored_in(model, dtype):
    """`model` with every param stored in `dtype` and computed in fp32, for a PyTorch without
    CPU kernels in `dtype`: autograd still produces each gradient in `dtype` (the cast's
    backward), which is what the engine receives."""
    for module in list(model.modules()):
        for name, _ in list(module.named_parameters(recurse=False)):
            parametrize.register_parametrization(module, name, Upcast())
    return model.to(dtype)


def head_weight(model):
    """The head's stored weight (the parametrization's original where there is one)."""
    if parametrize.is_parametrized(model.head, "weight"):
        return model.head.parametrizations.weight.original
    return model.head.weight


@pytest.mark.parametrize("dtype,name", [(torch.bfloat16, "bf16"), (torch.float16, "fp16")])
def test_half_precision_params_train_and_skip_overflowing_steps(dtype, name):
    """16-bit params with fp32 masters and dynamic loss scaling: an overflowing step is
    skipped on every rank (params unchanged), the others train. Where this PyTorch has no CPU
    kernels for `dtype`, the params are stored in it and the layers compute in fp32."""
    check_half_precision(dtype, name)


def check_half_precision(dtype, name, device="cpu"):
    """The test above, with the models and batches on `device`."""
    config = {"stage": 2, "optimizer": OPTIMIZER,
              "precision": {"param": name, "grad": name, "reduce": name, "master_weights": True},
              "loss_scale": {"mode": "dynamic", "initial_power": 8, "hysteresis": 1}}
    if device != "cpu" or cpu_supports(dtype):
        models = [TinyLM().to(device, dtype) for _ in range(2)]
    else:
        models = [stored_in(TinyLM(), dtype) for _ in range(2)]

    def body(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, config, comm)
        infos, snapshots = [], []
        for step in range(6):
            tokens, targets = (t.to(device) for t in batch(step))
            mine = slice(rank * BATCH // 2, (rank + 1) * BATCH // 2)
            loss = engine.scale(loss_of(model, tokens[mine], targets[mine]))
            if step == 3 and rank == 1:
                loss = loss * float("inf")  # an overflow on one rank only
            loss.backward()
            infos.append(engine.step())
            snapshots.append(head_weight(model).detach().clone())
        assert head_weight(model).dtype == dtype
        engine.close()
        return infos, snapshots

    for infos, snapshots in run_ranks(2, body):
        assert [info["skipped"] for info in infos] == [False, False, False, True, False, False]
        assert infos[4]["loss_scale"] == infos[2]["loss_scale"] / 2
        assert torch.equal(snapshots[3], snapshots[2])
        assert not torch.equal(snapshots[4], snapshots[3])
        assert all(torch.isfinite(s.float()).all() for s in snapshots)


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_rank0_values_reach_every_rank_before_the_first_forward(stage):
    """Ranks built with different initial values train like rank 0's model (as DDP's
    broadcast at construction)."""
    for trained in train_sharded(stage, perturb=True):
        assert_close(trained, reference())


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_model_trained_through_another_method_than_its_forward(stage):
    """CLIP's model.encode_text(x): the model's own forward never runs, so none of its hooks
    do; rank 0's values still reach every rank before any computes (initialize() makes the
    replicas equal; stage 3 refuses different ones there)."""
    for trained in train_sharded(stage, perturb=stage < 3, via_method=True):
        assert_close(trained, reference())


@pytest.mark.parametrize("stage", [1, 3])
def test_rank0_frozen_weights_and_buffers_reach_every_rank(stage):
    """Ranks that loaded other frozen (LoRA base) weights and buffers train like rank 0's
    model: initialize copies them from rank 0, as DDP does."""
    for trained in train_sharded(stage, perturb_frozen=True):
        assert_close(trained, reference())


def test_verify_compares_at_the_first_iteration_after_every_rank_loaded_the_same_values():
    """guard.init_params "verify": ranks built with different values that all load the same
    ones after initialize() train; the comparison waits for the first iteration."""
    models = [TinyLM() for _ in range(2)]
    with torch.no_grad():
        for param in models[1].parameters():
            param.add_(0.1)
    same = TinyLM().state_dict()

    def body(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, {
            "stage": 1, "optimizer": OPTIMIZER,
            "guard": {"init_params": "verify", "timeout_s": 30}}, comm)
        model.load_state_dict(same)
        loss_of(model, *batch(0)).backward()
        info = engine.step()
        engine.close()
        return info["step"]

    assert run_ranks(2, body) == [1, 1]


def test_stage3_refuses_different_initial_values():
    with pytest.raises(zerort.InvalidArgumentError) as raised:
        train_sharded(3, perturb=True)
    assert "differ" in str(raised.value)


@pytest.mark.parametrize("stage", [2, 3])
def test_non_reentrant_checkpointing(stage):
    """The recommended checkpointing: at stage 3 the recomputed forward runs inside backward,
    after the unit was gathered for it."""
    want = reference(non_reentrant=True)
    for trained in train_sharded(stage, non_reentrant=True):
        assert_close(trained, want)


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_dim_params_train(stage):
    want = reference(scalar=True)
    for trained in train_sharded(stage, scalar=True):
        assert_close(trained, want)


def test_closing_in_any_order_is_safe():
    comm = zerort.local_group(1)[0]
    model = TinyLM()
    engine = zerort.torch.initialize(model, {"stage": 3}, comm)
    state = engine.state_dict()
    comm.close()  # frees the engine first; the model keeps no storage at stage 3
    engine.close()
    engine.close()
    with pytest.raises(zerort.FailedPreconditionError):
        engine.engine.step()
    assert "head.weight" in state


def test_bad_config_key_is_an_invalid_argument():
    comm = zerort.local_group(1)[0]
    with pytest.raises(zerort.InvalidArgumentError) as raised:
        zerort.torch.initialize(TinyLM(), {"stage": 2, "bucket": {}}, comm)
    assert "bucket" in str(raised.value)


def test_branch_skipped_on_one_rank_fails_cleanly_on_every_rank():
    """DDP: "Expected to have finished reduction in the prior iteration", or a hang. Here the
    skipping rank names the params; its peer gets an error within guard.timeout_s."""
    _, failures = train_sharded(2, guard={"timeout_s": 3}, raise_first=False, branch=True)
    assert isinstance(failures[1], zerort.UnusedParametersError)
    assert "branch.weight" in str(failures[1])
    assert isinstance(failures[0], zerort.ZeroError)


@pytest.mark.parametrize("stage", [1, 2])
def test_branch_skipped_on_one_rank_with_on_unused_zero(stage):
    """The skipping rank contributes zeros: PyTorch's mean gradient over both halves."""
    model = TinyLM(branch=True)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=OPTIMIZER["lr"], betas=OPTIMIZER["betas"],
                                  eps=OPTIMIZER["eps"], weight_decay=OPTIMIZER["weight_decay"])
    rows = BATCH // 2
    for step in range(STEPS):
        optimizer.zero_grad()
        tokens, targets = batch(step)
        loss = sum(loss_of(model, tokens[r * rows:(r + 1) * rows],
                           targets[r * rows:(r + 1) * rows], not skips_branch(r, step))
                   for r in range(2)) / 2
        loss.backward()
        optimizer.step()
    want = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    for trained in train_sharded(stage, guard={"on_unused": "zero"}, branch=True):
        assert_close(trained, want)


@pytest.mark.parametrize("stage", [1, 2])
def test_ddp_style_no_sync_loop_matches_single_process_pytorch(stage):
    """gradient_accumulation_steps = 2, written as for DDP: the first half of each rank's
    rows under no_sync, the second half then step()."""
    config = {"stage": stage, "optimizer": OPTIMIZER, "gradient_accumulation_steps": 2,
              "buckets": {"first_bucket_elems": 64, "reduce_bucket_elems": 256},
              "guard": {"timeout_s": 30}}
    world = 2
    models = [TinyLM() for _ in range(world)]
    bounds = [BATCH * r // world for r in range(world + 1)]

    def body(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, config, comm)
        middle = (bounds[rank] + bounds[rank + 1]) // 2
        halves = [slice(bounds[rank], middle), slice(middle, bounds[rank + 1])]
        for step in range(STEPS):
            tokens, targets = batch(step)

            def backward(rows):
                weight = (rows.stop - rows.start) * world / BATCH
                (weight * loss_of(model, tokens[rows], targets[rows])).backward()

            with engine.no_sync():
                backward(halves[0])
            with pytest.raises(zerort.FailedPreconditionError, match="outside no_sync"):
                with engine.no_sync():
                    pass
            backward(halves[1])
            assert engine.step() is not None  # the optimizer stepped
        engine.close()
        return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    want = reference()
    for got in run_ranks(world, body):
        assert_close(got, want)


@pytest.mark.parametrize("stage", [2, 3])
def test_post_accumulate_grad_hook_branch(stage, monkeypatch):
    """The PyTorch >= 2.1 branch of the gradient hand-over:
    Tensor.register_post_accumulate_grad_hook. On a PyTorch without that method it runs
    against a stand-in with the same contract (hook(param) once the gradient is in
    param.grad, a handle with remove()); on 2.x, against the real one."""
    real = getattr(torch.Tensor, "register_post_accumulate_grad_hook", None)
    calls, nodes = [], []

    def stand_in(param, hook):
        node = param.expand_as(param).grad_fn.next_functions[0][0]
        nodes.append(node)
        return node.register_hook(lambda *_: hook(param))

    def counting(param, hook):
        def counted(tensor):
            calls.append(tensor.shape)
            hook(tensor)
        return (real or stand_in)(param, counted)

    monkeypatch.setattr(torch.Tensor, "register_post_accumulate_grad_hook", counting,
                        raising=False)
    want = reference()
    for trained in train_sharded(stage):
        assert_close(trained, want)
    assert calls, "the hand-over did not go through register_post_accumulate_grad_hook"
