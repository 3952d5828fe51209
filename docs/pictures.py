"""The pictures of docs/, drawn from the project's own code, so they stay true as it changes.

    python docs/pictures.py                      # all five into docs/pictures/ (about a minute)
    python docs/pictures.py masks schedule       # some of them
    python docs/pictures.py --out /tmp/pictures  # elsewhere

- masks.png: what each query may attend to in a padded batch, read off the attention weights
  of the model itself (a weight above zero: allowed);
- positions.png: the sinusoidal position table the model adds to its embeddings;
- schedule.png: the learning rate under a 30-minute budget at two paces, by the optimizer's
  schedule and the time-budget callback's clock;
- attention.png, curves.png: a tiny model trained on the reverse task with train() (about 40 s
  on 2 cores): its attention while reversing a sequence, and the run's training curves.

Nothing is downloaded; the run trains in a temporary directory.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # compose_train: train.yaml with overrides, as tests do

import torch  # noqa: E402

from seq2seq.curves import save_figure  # noqa: E402

OUT = ROOT / "docs" / "pictures"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def masks(out: Path) -> None:
    """Encoder self-attention, decoder self-attention and cross-attention of the second
    example of a padded batch, as the untrained model applies them."""
    from seq2seq.core.attention import capture_attention
    from seq2seq.core.model import ModelConfig, Seq2SeqTransformer

    torch.manual_seed(0)
    sizes = dict(d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=1)
    config = ModelConfig(src_vocab_size=12, tgt_vocab_size=12, dropout=0.0, **sizes)
    model = Seq2SeqTransformer(config).eval()
    pad, bos = model.config.pad_id, model.config.bos_id
    src = torch.tensor([[5, 6, 7, 8, 9, 10], [7, 8, 9, 10, pad, pad]])
    tgt = torch.tensor([[bos, 10, 9, 8, 7, 6], [bos, 10, 9, 8, pad, pad]])  # decoder inputs
    with torch.inference_mode(), capture_attention(model) as maps:
        model(src, tgt)
    source = ["7", "8", "9", "10", "<pad>", "<pad>"]
    decoder = ["<bos>", "10", "9", "8", "<pad>", "<pad>"]
    panels = [
        ("encoder self-attention\n(source padding hidden)", "encoder.layers.0.self_attn",
         source, source),
        ("decoder self-attention\n(causal, and target padding hidden)",
         "decoder.layers.0.self_attn", decoder, decoder),
        ("cross-attention\n(source padding hidden)", "decoder.layers.0.cross_attn",
         decoder, source),
    ]  # fmt: skip
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12, 4.4))
    fig.subplots_adjust(left=0.06, right=0.99, bottom=0.2, top=0.8, wspace=0.35)
    for ax, (title, name, queries, keys) in zip(axes, panels, strict=True):
        allowed = (maps[name][1, 0] > 0).float()  # example 2, head 0 (every head: the same)
        assert torch.equal(maps[name][1] > 0, (maps[name][1, :1] > 0).expand_as(maps[name][1]))
        ax.imshow(allowed.numpy(), cmap="Greens", vmin=0, vmax=1.3)
        ax.set_xticks(range(len(keys)), keys, rotation=45)
        ax.set_yticks(range(len(queries)), queries)
        ax.set_xlabel("key")
        ax.set_ylabel("query")
        ax.set_title(title, fontsize=10)
    fig.suptitle("Who may attend to whom: a padded batch's second example (green: allowed)")
    save_figure(fig, out / "masks.png")


def positions(out: Path) -> None:
    """The sinusoidal table (position x dimension) and four of its dimensions."""
    from seq2seq.core.model import SinusoidalPositions

    table = SinusoidalPositions(64, 128).table
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.13, top=0.86, wspace=0.2)
    image = left.imshow(table.T.numpy(), cmap="RdBu", aspect="auto", vmin=-1, vmax=1)
    left.set_xlabel("position")
    left.set_ylabel("dimension")
    left.set_title("the table: sin on even dimensions, cos on odd", fontsize=10)
    fig.colorbar(image, ax=left)
    for dim in (0, 1, 10, 40):
        right.plot(table[:, dim].numpy(), label=f"dimension {dim}")
    right.set_xlabel("position")
    right.set_title("each pair of dimensions turns at its own frequency", fontsize=10)
    right.legend(fontsize=8)
    fig.suptitle("Sinusoidal positions (64 positions, d_model 128; seq2seq/core/model.py)")
    save_figure(fig, out / "positions.png")


def budgeted_lr(
    steps: int, budget_s: float, warmup: int, peak: float, share: float | None = None
) -> list[float]:
    """The learning rate at each step of a run that makes `steps` steps in a time budget,
    by the optimizer's schedule and the TimeBudget callback's clock (a steady pace), with the
    warmup ending at `warmup` steps or at `share` of the training time, whichever is sooner."""
    from types import SimpleNamespace

    import torch
    from helpers import clocked_budget

    from seq2seq.hparams import TrainingConfig
    from seq2seq.training.optim import optimizer_with_schedule

    clock = {"elapsed": 0.0}
    budget = clocked_budget(budget_s, clock)
    # The optimizer's own schedule, wired to the budget as a run's trainer would wire it.
    trainer = SimpleNamespace(
        callbacks=[budget], precision="32-true", estimated_stepping_batches=float("inf")
    )
    settings = TrainingConfig(
        lr=peak, schedule="cosine", warmup_steps=warmup, warmup_share=share, min_lr_ratio=0.0
    )
    weight = torch.zeros(1, requires_grad=True)
    scheduler = optimizer_with_schedule([("weight", weight)], settings, trainer)["lr_scheduler"][
        "scheduler"
    ]
    factor = scheduler.lr_lambdas[0]
    pace = 0.9 * budget_s / steps  # training's share of the budget (the rest: evaluation)
    rates = []
    for step in range(steps):
        clock["elapsed"] = step * pace
        rates.append(peak * factor(step))
    return rates


def schedule(out: Path) -> None:
    """experiment=tatoeba_en_fr's schedule (2e-3 after a warmup of 1,000 steps or a quarter of
    the training time, whichever is sooner; cosine to the deadline) on this project's machine
    and on a machine or corpus 3.8x slower a step."""
    plt = _pyplot()
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(12, 4.2))
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.13, top=0.86, wspace=0.22)
    for steps, label in ((4082, "4,082 steps in 30 min (Tatoeba, this machine)"),
                         (1074, "1,074 steps in 30 min (3.8x slower a step)")):  # fmt: skip
        rates = budgeted_lr(steps, 1800.0, warmup=1000, peak=2e-3, share=0.25)
        by_step.plot(rates, label=label)
        by_time.plot([30 * s / steps for s in range(steps)], rates, label=label)
    by_step.set_xlabel("optimizer step")
    by_time.set_xlabel("minutes of the budget")
    for ax in (by_step, by_time):
        ax.set_ylabel("learning rate")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        "The learning rate under trainer.max_time=00:00:30:00 "
        "(warmup 1,000 steps or a quarter of the training time)"
    )
    save_figure(fig, out / "schedule.png")


def trained_run(work: Path) -> dict:
    """A tiny model trained on the reverse task (train.py's train(), the project's recipe)."""
    from helpers import compose_train

    from train import train

    overrides = ["experiment=reverse", "data.corpus.train_size=6000", "trainer.max_epochs=4",
                 "data.corpus.val_size=200", "data.corpus.test_size=200"]  # fmt: skip
    return train(compose_train(work, work / "data", overrides))


def attention_and_curves(out: Path) -> None:
    from seq2seq.curves import curves_figure, read_metrics
    from seq2seq.inspect import plot_attention

    with tempfile.TemporaryDirectory() as work:
        summary = trained_run(Path(work))
        plot_attention(summary["best_checkpoint"], "3 1 4 1 5 9 2 6", str(out / "attention.png"))
        # What every run draws as its curves.png, titled for the docs instead of by its path.
        title = "experiment=reverse, 6,000 training sequences, 4 epochs: the run's curves.png"
        save_figure(
            curves_figure({"": read_metrics(summary["run_dir"])}, title), out / "curves.png"
        )


PICTURES: dict[str, Callable[[Path], None]] = {
    "masks": masks,
    "positions": positions,
    "schedule": schedule,
    "attention": attention_and_curves,  # and curves.png: one training run for both
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pictures", nargs="*", help=f"of {', '.join(PICTURES)} (default: all)")
    parser.add_argument("--out", type=Path, default=OUT, help=f"default: {OUT}")
    args = parser.parse_args(argv)
    unknown = [name for name in args.pictures if name not in PICTURES]
    if unknown:
        parser.error(f"no picture {unknown[0]!r}; choose from {', '.join(PICTURES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.pictures or list(PICTURES):
        PICTURES[name](args.out)
        print(f"drew {name} into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
