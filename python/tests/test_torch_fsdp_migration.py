"""An FSDP training loop switched to ZeroRT as the README's "Coming from FSDP" says: the
wrapping line becomes deepspeed.initialize with the script's own torch optimizer, and the
loop keeps loss.backward(), optimizer.step(), its own scheduler.step() and
optimizer.zero_grad(), gradient accumulation under no_sync(), model.clip_grad_norm_() before
each step (engine.clip_grad_norm_), and reads full values where FSDP's summon_full_params and
full state dict do; it equals single-process PyTorch at every stage on 2 in-process ranks."""
import pytest
import torch

import zerort
import zerort.torch
from zerort.torch import deepspeed
from test_torch_engine import TinyLM, loss_of, micro_batch, run_ranks

WORLD, STEPS, ACCUMULATION, ROWS = 2, 4, 2, 4
MAX_NORM = 0.4  # below the first steps' norms: those steps are clipped


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def rows(step, micro, rank):
    return micro_batch(200, WORLD, ACCUMULATION, ROWS, step, micro, rank)


def warmup(optimizer):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 3))


def fsdp_like_loop(model, optimizer, scheduler, rank, no_sync, clip_grad_norm_):
    """The loop of an FSDP script: accumulation under no_sync(), the norm clipped, then the
    optimizer step. Returns the norms clip_grad_norm_ gave."""
    norms = []
    for step in range(STEPS):
        for micro in range(ACCUMULATION):
            context = no_sync() if micro + 1 < ACCUMULATION else _nothing()
            with context:
                (loss_of(model, *rows(step, micro, rank)) / ACCUMULATION).backward()
        norms.append(clip_grad_norm_(MAX_NORM).item())
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    return norms


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def reference():
    model = TinyLM()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                  lr=0.01, weight_decay=0.05)
    scheduler = warmup(optimizer)
    norms = []
    for step in range(STEPS):
        for micro in range(ACCUMULATION):
            for rank in range(WORLD):
                (loss_of(model, *rows(step, micro, rank)) / (ACCUMULATION * WORLD)).backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM).item())
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    return {n: p.detach().clone() for n, p in model.named_parameters()}, norms


@pytest.mark.parametrize("clip", ["engine", "torch"])
@pytest.mark.parametrize("stage", [0, 2, 3])
def test_an_fsdp_loop_trains_as_single_process_pytorch(stage, clip):
    """clip "torch": the loop keeps a plain PyTorch script's
    torch.nn.utils.clip_grad_norm_(model.parameters(), ...), which clips through the engine."""
    want, want_norms = reference()
    assert want_norms[0] > MAX_NORM  # the clipping is exercised
    models = [TinyLM() for _ in range(WORLD)]

    def body(rank, comm):
        model = models[rank]
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                      lr=0.01, weight_decay=0.05)
        config = {"zero_optimization": {"stage": stage}, "gradient_clipping": 0.0,
                  "gradient_accumulation_steps": ACCUMULATION}
        engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                                       config=config, comm=comm)
        if clip == "engine":
            clip_grad_norm_ = engine.clip_grad_norm_  # was model.clip_grad_norm_
        else:
            def clip_grad_norm_(max_norm):
                return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        norms = fsdp_like_loop(model, optimizer, warmup(optimizer), rank, engine.no_sync,
                               clip_grad_norm_)
        with zerort.torch.gathered(list(model.parameters())):  # summon_full_params
            summoned = {n: p.detach().clone() for n, p in model.named_parameters()}
        full_state = engine.module_state_dict()  # FULL_STATE_DICT
        engine.close()
        return summoned, full_state, norms

    for summoned, full_state, norms in run_ranks(WORLD, body):
        assert norms == pytest.approx(want_norms, rel=1e-5)
        for name, value in want.items():
            scale = max(value.abs().max().item(), 1e-3)
            assert (summoned[name] - value).abs().max().item() <= 1e-5 * scale, name
            assert torch.equal(full_state[name], summoned[name]), name


def test_clip_grad_norm_refuses_what_it_cannot_do():
    model = TinyLM()
    config = {"zero_optimization": {"stage": 2}, "gradient_accumulation_steps": 2}
    engine = zerort.torch.initialize(model, config, zerort.local_group(1)[0])
    with pytest.raises(zerort.UnimplementedError, match="norm_type"):
        engine.clip_grad_norm_(1.0, norm_type=1)
    loss_of(model, *rows(0, 0, 0)).backward()
    with pytest.raises(zerort.FailedPreconditionError, match="clip_grad_norm_.*0 ended so far"):
        engine.clip_grad_norm_(1.0)  # after the first of 2 micro-batches: no gradient yet
    engine.step()
    loss_of(model, *rows(0, 1, 0)).backward()
    with pytest.raises(zerort.InvalidArgumentError, match="max_norm"):
        engine.clip_grad_norm_(-1.0)
    norm = engine.clip_grad_norm_(float("inf"))  # the norm alone, not clipped
    assert norm.dtype == torch.float32 and norm.item() > 0
    engine.step()
    assert engine.was_step_applied() and engine.get_global_grad_norm() == norm.item()
    engine.close()


def test_torch_clip_grad_norm_refuses_part_of_an_engine_and_leaves_other_models_alone():
    model, plain = TinyLM(), TinyLM()
    engine = zerort.torch.initialize(model, {"stage": 2}, zerort.local_group(1)[0])
    loss_of(model, *rows(0, 0, 0)).backward()
    with pytest.raises(zerort.InvalidArgumentError, match="not among those passed"):
        torch.nn.utils.clip_grad_norm_(model.head.parameters(), 0.1)
    loss_of(plain, *rows(0, 0, 0)).backward()
    with pytest.raises(zerort.InvalidArgumentError, match="have a .grad of their own"):
        torch.nn.utils.clip_grad_norm_(list(model.parameters()) + list(plain.parameters()), 0.1)
    with pytest.raises(zerort.InvalidArgumentError, match="max_norm=0"):
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.0)
    want = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(p.grad) for p in plain.parameters()
                     if p.grad is not None]))
    assert torch.nn.utils.clip_grad_norm_(plain.parameters(), 1e9).item() == want.item()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9, error_if_nonfinite=True)
    engine.step()
    assert norm.item() == engine.get_global_grad_norm() > 0
    engine.close()
