"""Copy task convergence: training time and steps until held-out exact match reaches 100% and
stays there, for our default recipe and for the Annotated Transformer's copy-task settings.

    python bench/copy_convergence.py                 # 3 seeds each (2 CPU cores: ~20 minutes)
    python bench/copy_convergence.py --seeds 0 --eval-every 50
    python bench/copy_convergence.py --runs ours model.training.lr=1e-2   # try another recipe

Ours: `python train.py`'s config (copy, 1-10 symbols of 10, 13,000 training sequences, the
tiny model, 2 epochs), trained by Lightning; its 1,000 held-out test sequences are decoded
greedily every --eval-every steps. The baseline: a plain loop over nn.Transformer with the
Annotated Transformer's settings (vocabulary 11, length 10, batch 80, d_model 512, 8 heads,
d_ff 2048, 2+2 layers, dropout 0.1, Adam lr 0.5 with Noam warmup 400, 400 steps), its own
1,000 held-out sequences decoded greedily every --eval-every-baseline steps. Training time
counts only the training steps, not the evaluations. "Reached" is the first evaluation from
which every later one is 100%.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from common import environment, print_table  # noqa: E402

from seq2seq.core.model import SinusoidalPositions  # noqa: E402


def reached(history: list[tuple[int, float, float]]) -> tuple[int, float] | None:
    """(step, training seconds) of the first evaluation from which exact match stays 1.0."""
    found = None
    for step, seconds, exact in reversed(history):
        if exact < 1.0:
            break
        found = (step, seconds)
    return found


# --- ours ----------------------------------------------------------------------------------


def ours(
    seed: int, every: int, data_dir: str, overrides: list[str]
) -> list[tuple[int, float, float]]:
    import lightning as L
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from hydra.utils import instantiate
    from omegaconf import open_dict

    from seq2seq.training.metrics import exact_match
    from train import build_module

    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=[f"seed={seed}", *overrides], return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # the config's ${hydra:...} values need it
    with open_dict(cfg):
        cfg.data.data_dir = data_dir
        del cfg.hydra
    L.seed_everything(seed, workers=True)
    datamodule = instantiate(cfg.data)
    datamodule.setup("fit")
    module = build_module(cfg, *datamodule.tokenizers())
    test = [batch for batch in datamodule.test_dataloader()]
    history: list[tuple[int, float, float]] = []

    class Evaluate(L.Callback):
        def __init__(self) -> None:
            self.trained = 0.0
            self.start = 0.0

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            self.start = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            self.trained += time.perf_counter() - self.start
            step = trainer.global_step
            if step % every == 0 or step == trainer.estimated_stepping_batches:
                pl_module.eval()
                v = pl_module.tgt_vocab
                hits = [
                    exact_match(pl_module.greedy(b["src"]), b["labels"], v.pad_id, v.eos_id)
                    .sum()
                    .item()
                    for b in test
                ]
                pl_module.train()
                history.append((step, self.trained, sum(hits) / 1000))

    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_epochs=cfg.trainer.max_epochs,
        max_steps=cfg.trainer.max_steps, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        gradient_clip_val=cfg.trainer.gradient_clip_val, limit_val_batches=0,
        num_sanity_val_steps=0, callbacks=[Evaluate()],
    )  # fmt: skip
    trainer.fit(module, train_dataloaders=datamodule.train_dataloader())
    return history


# --- the Annotated Transformer's copy task on nn.Transformer -------------------------------


class Baseline(nn.Module):
    def __init__(self, vocab: int = 11, d: int = 512, heads: int = 8, d_ff: int = 2048) -> None:
        super().__init__()
        self.src_embed = nn.Embedding(vocab, d)
        self.tgt_embed = nn.Embedding(vocab, d)
        self.positions = SinusoidalPositions(64, d)  # the paper's table, as ours uses
        self.drop = nn.Dropout(0.1)
        self.transformer = nn.Transformer(d, heads, 2, 2, d_ff, 0.1, batch_first=True,
                                          norm_first=True)  # fmt: skip
        self.out = nn.Linear(d, vocab)
        self.scale = math.sqrt(d)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def embed(self, table: nn.Embedding, ids: Tensor) -> Tensor:
        return self.drop(table(ids) * self.scale + self.positions(ids.size(1)))

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.size(1))
        h = self.transformer(self.embed(self.src_embed, src), self.embed(self.tgt_embed, tgt),
                             tgt_mask=causal, tgt_is_causal=True)  # fmt: skip
        return self.out(h)

    @torch.no_grad()
    def greedy(self, src: Tensor, length: int) -> Tensor:
        ys = src[:, :1]  # the start symbol, as the Annotated Transformer decodes
        for _ in range(length - 1):
            ys = torch.cat([ys, self(src, ys)[:, -1].argmax(-1, keepdim=True)], 1)
        return ys


def copy_batch(generator: torch.Generator, batch: int, vocab: int = 11, length: int = 10):
    data = torch.randint(1, vocab, (batch, length), generator=generator)
    data[:, 0] = 1  # the Annotated Transformer's start symbol
    return data


def baseline(seed: int, every: int) -> list[tuple[int, float, float]]:
    torch.manual_seed(seed)
    model = Baseline()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.5, betas=(0.9, 0.98), eps=1e-9)

    def noam(step: int) -> float:  # the Annotated Transformer's rate(step, 512, 1.0, 400)
        step = max(step, 1)
        return 512**-0.5 * min(step**-0.5, step * 400**-1.5)

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: noam(s + 1))
    train_g = torch.Generator().manual_seed(seed)
    held_out = copy_batch(torch.Generator().manual_seed(10_000 + seed), 1000)
    history: list[tuple[int, float, float]] = []
    trained = 0.0
    for step in range(1, 401):  # 20 epochs of 20 batches of 80
        model.train()
        start = time.perf_counter()
        data = copy_batch(train_g, 80)
        logits = model(data, data[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), data[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        trained += time.perf_counter() - start
        if step % every == 0 or step == 400:
            model.eval()
            exact = (model.greedy(held_out, 10) == held_out).all(1).float().mean().item()
            history.append((step, trained, exact))
    return history


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--eval-every", type=int, default=25, help="our steps between evals")
    parser.add_argument("--eval-every-baseline", type=int, default=20)
    parser.add_argument("--runs", choices=["both", "ours", "baseline"], default="both")
    parser.add_argument(
        "overrides",
        nargs="*",
        help="Hydra overrides for ours, e.g. model.training.lr=1e-2 (default: none)",
    )
    args = parser.parse_args()
    import logging

    logging.getLogger("lightning").setLevel(logging.WARNING)
    data_dir = str(ROOT / "data" / "cache")
    rows = []
    ours_name = " ".join(["ours (python train.py", *args.overrides]) + ")"
    for name, run in (
        (ours_name, lambda s: ours(s, args.eval_every, data_dir, args.overrides)),
        ("nn.Transformer, Annotated settings", lambda s: baseline(s, args.eval_every_baseline)),
    ):
        if args.runs != "both" and not name.startswith(
            {"ours": "ours", "baseline": "nn."}[args.runs]
        ):
            continue
        for seed in args.seeds:
            history = run(seed)
            hit = reached(history)
            final_step, final_seconds, final_exact = history[-1]
            rows.append([
                name, seed,
                f"{hit[0]}" if hit else "never", f"{hit[1]:.1f}" if hit else "-",
                final_step, f"{final_seconds:.1f}", f"{final_exact:.1%}",
            ])  # fmt: skip
            print(f"  {' | '.join(map(str, rows[-1]))}", file=sys.stderr)  # as it goes
    print(f"# copy-task convergence, {environment()}\n")
    print_table(
        ["run", "seed", "steps to 100% (held)", "train s to 100%", "steps", "train s",
         "final exact match"],
        rows,
    )  # fmt: skip
    for name in ("ours", "nn.Transformer"):
        times = [float(r[3]) for r in rows if r[0].startswith(name) and r[3] != "-"]
        if times:
            print(f"{name}: median {statistics.median(times):.1f} s of training to 100%")


if __name__ == "__main__":
    main()
