"""The optimizer and the learning-rate schedule (seq2seq/training/optim.py): the schedules by
their definitions, by steps and by a budget's clock; AdamW and Muon step as torch's own."""

from __future__ import annotations

import pytest
import torch
from helpers import clocked_budget

from seq2seq.training.module import Seq2SeqModule


def test_learning_rate_schedules_are_continuous_and_lazy() -> None:
    from seq2seq.training.optim import by_steps, lr_lambda

    asked = []

    def total() -> int:
        asked.append(True)
        return 110

    cosine = lr_lambda("cosine", 10, 0.1, by_steps(10, total, decays=True))
    assert [cosine(s) for s in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])
    assert not asked  # the warmup never needs the total (a resume restores the loader first)
    assert cosine(10) == pytest.approx(1.0) and cosine(60) == pytest.approx(0.55)
    assert cosine(110) == pytest.approx(0.1) and cosine(500) == pytest.approx(0.1)
    asked.clear()
    inverse = lr_lambda("inverse_sqrt", 4, 0.0, by_steps(4, total, decays=False))
    assert [inverse(s) for s in (3, 15)] == pytest.approx([1.0, 0.5])
    assert not asked  # a schedule with no end never asks for it
    assert lr_lambda("constant", 0, 0.0, by_steps(0, total, decays=False))(1000) == 1.0
    assert lr_lambda("cosine", 0, 0.0, by_steps(0, total, decays=True))(0) == 1.0


def test_the_warmup_stable_decay_schedule_is_its_definition_by_steps_and_by_the_clock() -> None:
    """schedule=wsd: the warmup, the peak until the last cooldown_share of the training after
    it, then a straight line to min_lr_ratio; against a plain reference at every step, and by
    the clock's progress where a budget gives one. Its settings are checked."""
    from seq2seq.hparams import TrainingConfig
    from seq2seq.training.optim import by_steps, lr_lambda

    warmup, total, cooldown, floor = 10, 110, 0.2, 0.1

    def reference(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / (total - warmup))
        if progress <= 1 - cooldown:
            return 1.0
        return floor + (1 - floor) * (1 - progress) / cooldown

    asked = []
    steps = by_steps(warmup, lambda: asked.append(1) or total, decays=True)
    wsd = lr_lambda("wsd", warmup, floor, steps, cooldown_share=0.2)
    assert [wsd(s) for s in range(warmup)] == pytest.approx([reference(s) for s in range(10)])
    assert not asked  # lazy, as the cosine: a resume restores the loader first
    assert [wsd(s) for s in range(200)] == pytest.approx([reference(s) for s in range(200)])
    assert wsd(50) == 1.0 and wsd(90) == pytest.approx(1.0) and wsd(100) == pytest.approx(0.55)
    assert wsd(110) == pytest.approx(0.1)
    by_clock = lr_lambda("wsd", warmup, 0.0, lambda step: (False, step / 100), 0.2)
    assert [by_clock(s) for s in (50, 80, 90, 100)] == pytest.approx([1.0, 1.0, 0.5, 0.0])
    assert TrainingConfig(schedule="wsd", cooldown_share=0.2, warmup_share=0.25)
    with pytest.raises(ValueError, match=r"^model.training.schedule=wsd needs model.training.co"):
        TrainingConfig(schedule="wsd")
    not_wsd = r"^model.training.cooldown_share=0.2 is the decay of schedule=wsd, not of cosine: "
    with pytest.raises(ValueError, match=not_wsd):
        TrainingConfig(schedule="cosine", cooldown_share=0.2)
    with pytest.raises(ValueError, match=r"^model.training.cooldown_share must be a number in "
                       r"\(0, 1\], got 0$"):  # fmt: skip
        TrainingConfig(schedule="wsd", cooldown_share=0)


def test_optimizer_steps_exactly_like_torchs_plain_adamw() -> None:
    """The fused AdamW kernel is a speed choice only: one step moves every parameter as
    torch's for-loop AdamW does, with weight decay on matrices and none on biases or norms."""
    from seq2seq.data.vocab import Vocabulary

    torch.manual_seed(0)
    vocab = Vocabulary([str(i) for i in range(10)]).to_dict()
    net = {"d_model": 32, "num_heads": 4, "d_ff": 64, "num_encoder_layers": 1,
           "num_decoder_layers": 1}  # fmt: skip
    training = {"lr": 1e-2, "weight_decay": 0.1, "warmup_steps": 0}
    module = Seq2SeqModule(net, vocab, vocab, training=training)
    fused = module.configure_optimizers()["optimizer"]
    assert all(group["fused"] for group in fused.param_groups)
    params = list(module.parameters())
    plain_params = [p.detach().clone().requires_grad_() for p in params]
    groups = [
        {"params": [q for q in plain_params if q.dim() >= 2], "weight_decay": 0.1},
        {"params": [q for q in plain_params if q.dim() < 2], "weight_decay": 0.0},
    ]
    plain = torch.optim.AdamW(groups, lr=1e-2, betas=(0.9, 0.98), foreach=False)
    for _ in range(3):
        for p, q in zip(params, plain_params, strict=True):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        fused.step()
        plain.step()
    for p, q in zip(params, plain_params, strict=True):
        torch.testing.assert_close(p, q)


def test_muon_steps_the_layers_matrices_as_torchs_muon_and_the_rest_as_torchs_adamw() -> None:
    """model.training.optimizer=muon: the encoder's and decoder's weight matrices move as
    torch.optim.Muon moves them (AdamW-matched rate, bf16 iterations as torch's; within bf16's
    rounding, as the matrices of one shape go through one batched product, torch's one at a
    time) and every other parameter as AdamW, under the schedule's changing rate; its state
    round-trips, and an AdamW state is refused."""
    from torch.optim.lr_scheduler import LambdaLR

    from seq2seq.data.vocab import Vocabulary
    from seq2seq.training.optim import MuonWithAdamW

    torch.manual_seed(0)
    vocab = Vocabulary([str(i) for i in range(10)]).to_dict()
    net = {"d_model": 32, "num_heads": 4, "d_ff": 64, "num_encoder_layers": 1,
           "num_decoder_layers": 1}  # fmt: skip
    training = {"optimizer": "muon", "lr": 1e-2, "weight_decay": 0.1, "warmup_steps": 2,
                "muon_precision": "bf16"}  # fmt: skip
    module = Seq2SeqModule(net, vocab, vocab, training=training)
    answer = module.configure_optimizers()
    optimizer, scheduler = answer["optimizer"], answer["lr_scheduler"]["scheduler"]
    named = list(module.named_parameters())
    hidden = {name for name, p in named if p.dim() == 2 and ".layers." in name}
    # Every projection and feed-forward matrix of both stacks; no embedding, no output layer.
    assert len(hidden) == 4 + 2 + 8 + 2
    assert not any("embed" in name or "generator" in name for name in hidden)
    params = [p for _, p in named]
    copies = {name: p.detach().clone().requires_grad_() for name, p in named}
    start = [p.detach().clone() for p in params]

    def moved_alike(ours: list, theirs: list) -> None:
        """AdamW's parameters equal; Muon's moves within 1% of torch's (bf16 keeps 8 bits)."""
        for (name, _), p, q, p0 in zip(named, ours, theirs, start, strict=True):
            if name in hidden:
                gap = ((p - p0) - (q - p0)).norm() / (q - p0).norm()
                assert gap < 1e-2, f"{name}: Muon's move differs from torch's by {gap:.2%}"
            else:
                torch.testing.assert_close(p, q)

    muon = torch.optim.Muon(
        [copies[n] for n in copies if n in hidden], lr=1e-2, weight_decay=0.1,
        adjust_lr_fn="match_rms_adamw",
    )  # fmt: skip
    rest = [copies[n] for n in copies if n not in hidden]
    adamw = torch.optim.AdamW(
        [{"params": [q for q in rest if q.dim() >= 2], "weight_decay": 0.1},
         {"params": [q for q in rest if q.dim() < 2], "weight_decay": 0.0}],
        lr=1e-2, betas=(0.9, 0.98), foreach=False,
    )  # fmt: skip
    rates = [LambdaLR(o, scheduler.lr_lambdas[0]) for o in (muon, adamw)]

    def step(optimizers: list, scheduled: list) -> None:
        for p, q in zip(params, copies.values(), strict=True):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        for o in optimizers:
            o.step()
        for s in scheduled:
            s.step()

    for _ in range(3):  # the rate rises over the warmup's 2 steps, then falls
        step([optimizer, muon, adamw], [scheduler, *rates])
    moved_alike(params, list(copies.values()))
    # Its state holds both optimizers' and carries on in a new instance, as a resume loads it.
    again = Seq2SeqModule(net, vocab, vocab, training=training)
    again.load_state_dict(module.state_dict())
    loaded = again.configure_optimizers()["optimizer"]
    loaded.load_state_dict(optimizer.state_dict())
    params = list(again.parameters())
    step([loaded, muon, adamw], [])
    moved_alike(params, list(copies.values()))
    plain = torch.optim.AdamW(params).state_dict()
    assert isinstance(loaded, MuonWithAdamW)
    with pytest.raises(ValueError, match=r"saved with model\.training\.optimizer=adamw"):
        loaded.load_state_dict(plain)
    with pytest.raises(ValueError, match=r"model\.training\.optimizer must be one of"):
        Seq2SeqModule(net, vocab, vocab, training={"optimizer": "sgd"})


def test_the_cosine_ends_at_the_step_limit_or_the_time_budget_whichever_comes_first() -> None:
    from seq2seq.training.callbacks import TimeBudget
    from seq2seq.training.optim import by_steps, lr_lambda

    clock = {"elapsed": 0.0}  # of 100 s, less the reserve before any validation (10 s): 90 s

    def cosine(total: float, budget: TimeBudget):
        progress = budget.schedule(by_steps(10, lambda: total, decays=True), 10, None)
        return lr_lambda("cosine", 10, 0.1, progress)

    by_clock = cosine(float("inf"), clocked_budget(100.0, clock))
    assert by_clock(500) == pytest.approx(1.0)  # no step limit, no time spent: the peak
    clock["elapsed"] = 45.0
    assert by_clock(20) == pytest.approx(0.55)  # half the time: half way down
    clock["elapsed"] = 90.0
    assert by_clock(20) == pytest.approx(0.1)  # the budget is spent: the end
    clock["elapsed"] = 0.0
    assert cosine(110.0, clocked_budget(100.0, clock))(110) == pytest.approx(0.1)  # steps first
    assert cosine(110.0, TimeBudget())(60) == pytest.approx(0.55)  # no budget: steps alone


def test_a_warmup_share_ends_the_warmup_by_the_clock() -> None:
    """model.training.warmup_share: with a time budget the warmup also ends at that share of the
    training time, rising by whichever of steps and clock is further, and the cosine starts
    from the peak there; without a budget the step count alone rules, as before."""
    from seq2seq.hparams import TrainingConfig
    from seq2seq.training.optim import by_steps, lr_lambda

    clock = {"elapsed": 0.0}
    budget = clocked_budget(100.0, clock)  # reserve before any validation: 10 s, so 90 s
    share, steps = 0.1, 1000
    plain = by_steps(steps, lambda: float("inf"), decays=True)
    factor = lr_lambda("cosine", steps, 0.0, budget.schedule(plain, steps, share))
    assert factor(0) == pytest.approx(1 / steps)
    clock["elapsed"] = 4.5  # 5% of the training time: half way up by the clock
    assert factor(5) == pytest.approx(0.5)
    clock["elapsed"] = 9.0  # 10%: the warmup is over at step 10, not 1000
    assert factor(10) == pytest.approx(1.0)
    clock["elapsed"] = 49.5  # half way from the warmup's end to the stop
    assert factor(60) == pytest.approx(0.5)
    clock["elapsed"] = 90.0
    assert factor(120) == pytest.approx(0.0, abs=1e-12)
    assert lr_lambda("cosine", steps, 0.0, plain)(5) == pytest.approx(6 / steps)  # no budget
    needs = r"model\.training\.warmup_share=0\.1 needs model\.training\.schedule=cosine"
    with pytest.raises(ValueError, match=needs):
        TrainingConfig(warmup_share=0.1)  # the default schedule: inverse_sqrt
    with pytest.raises(ValueError, match=r"model\.training\.warmup_share must be"):
        TrainingConfig(schedule="cosine", warmup_share=1.5)


def test_the_decay_by_the_clock_starts_where_the_warmup_ends(caplog) -> None:
    """A warmup that ends late leaves the cosine its whole range over the time left, with no
    jump, and a resume (the callback's state in the checkpoint) continues it."""
    from seq2seq.training.callbacks import TimeBudget
    from seq2seq.training.optim import by_steps

    clock = {"elapsed": 0.0}

    def budget_at(state=None) -> TimeBudget:
        budget = clocked_budget(100.0, clock)  # reserve before any validation: 10 s, so 90 s
        if state is not None:
            budget.load_state_dict(state)
        return budget

    def decay(budget: TimeBudget, step: int) -> float:
        return budget.schedule(by_steps(10, lambda: float("inf"), decays=True), 10, None)(step)[1]

    budget = budget_at()
    assert decay(budget, 5) == pytest.approx(0.6)  # warming up: 6 of 10 steps
    clock["elapsed"] = 54.0  # the warmup ends at 60% of the 90 s
    with caplog.at_level("WARNING"):
        assert decay(budget, 10) == 0.0
    assert "the warmup (model.training.warmup_steps=10) took 60% of the time budget" in caplog.text
    clock["elapsed"] = 72.0
    assert decay(budget, 11) == pytest.approx(0.5)
    resumed = budget_at(budget.state_dict())
    clock["elapsed"] = 90.0
    assert decay(resumed, 12) == pytest.approx(1.0)
    assert decay(TimeBudget(), 12) == pytest.approx(0.0)  # no budget, no step limit: at the peak
