"""Time and memory of our MultiHeadAttention against torch.nn.MultiheadAttention and the
explicit matmul-softmax path, side by side in one process.

    python bench/attention.py                  # docs/performance.md's table (CPU, a few minutes)
    python bench/attention.py --device cuda    # on a GPU
    python bench/attention.py --lengths 64 --dims 128 --heads 4 --repeats 3   # a quick look

Three implementations of the same self-attention, same weights and input:
  ours      MultiHeadAttention(x): scaled_dot_product_attention (fused kernels)
  torch     nn.MultiheadAttention(x, x, x, need_weights=False): its own fastest path
  explicit  MultiHeadAttention(x, need_weights=True): matmul, softmax, matmul (B*H*T*T scores)
Each repeat runs the three in turn; times are medians over --repeats, ratios the median of the
per-repeat ratios (so the machine's drift cancels). Memory is the peak added by one
forward+backward, measured in a fresh process on the CPU (peak resident size), or by the
allocator on CUDA.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from functools import partial
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import (
    environment,
    interleaved_seconds,
    median_ratio,
    peak_memory_bytes,
    print_table,
    run_isolated,
)

from seq2seq.core.attention import MultiHeadAttention

IMPLEMENTATIONS = ("ours", "torch", "explicit")


def build(d_model: int, heads: int, device: torch.device) -> dict:
    """The three callables over one shared set of weights."""
    head_dim = d_model // heads
    ours = MultiHeadAttention(d_model, head_dim, head_dim, heads).to(device)
    mha = nn.MultiheadAttention(d_model, heads, batch_first=True).to(device)
    with torch.no_grad():
        mha.in_proj_weight.copy_(
            torch.cat([ours.proj_q.weight, ours.proj_k.weight, ours.proj_v.weight])
        )
        mha.in_proj_bias.zero_()
        mha.out_proj.weight.copy_(ours.proj_o.weight)
        mha.out_proj.bias.copy_(ours.proj_o.bias)
    return {
        "ours": lambda x: ours(x),
        "torch": lambda x: mha(x, x, x, need_weights=False)[0],
        "explicit": lambda x: ours(x, need_weights=True)[0],
    }


def forward_backward(fn, x: torch.Tensor) -> None:
    x.grad = None
    fn(x).sum().backward()


def measure_times(args: argparse.Namespace, device: torch.device) -> list[list[object]]:
    rows = []
    for d_model in args.dims:
        for heads in args.heads:
            fns = build(d_model, heads, device)
            for length in args.lengths:
                x = torch.randn(args.batch, length, d_model, device=device, requires_grad=True)
                with torch.no_grad():
                    fwd = interleaved_seconds(
                        {n: partial(fns[n], x) for n in IMPLEMENTATIONS}, device, args.repeats
                    )
                both = interleaved_seconds(
                    {n: partial(forward_backward, fns[n], x) for n in IMPLEMENTATIONS},
                    device,
                    args.repeats,
                )
                med = {n: (statistics.median(fwd[n]), statistics.median(both[n])) for n in fns}
                rows.append(
                    [d_model, heads, length]
                    + [f"{med[n][0] * 1e3:.2f}" for n in IMPLEMENTATIONS]
                    + [f"{med[n][1] * 1e3:.2f}" for n in IMPLEMENTATIONS]
                    + [
                        f"{median_ratio(both['ours'], both['torch']):.2f}",
                        f"{median_ratio(both['ours'], both['explicit']):.2f}",
                    ]
                )
                print(f"  measured d_model={d_model} heads={heads} T={length}", file=sys.stderr)
    return rows


def memory_child(args: argparse.Namespace) -> None:
    """In a fresh process: peak memory of one forward+backward of one implementation."""
    device = torch.device(args.device)
    torch.manual_seed(0)
    fn = build(args.dims[0], args.heads[0], device)[args.child]
    x = torch.randn(args.batch, args.lengths[0], args.dims[0], device=device, requires_grad=True)
    forward_backward(fn, x[:, :8].detach().requires_grad_())  # load kernels, not counted
    peak = peak_memory_bytes(lambda: forward_backward(fn, x), device)
    print(json.dumps({"peak_mib": peak / 2**20}))


def measure_memory(args: argparse.Namespace) -> list[list[object]]:
    rows = []
    length = args.memory_length
    for d_model in args.dims:
        for heads in args.heads:
            peaks = {}
            for name in IMPLEMENTATIONS:
                child_args = ["--child", name, "--device", args.device, "--batch", str(args.batch)]
                child_args += [
                    "--dims",
                    str(d_model),
                    "--heads",
                    str(heads),
                    "--lengths",
                    str(length),
                ]
                peaks[name] = run_isolated(__file__, child_args)["peak_mib"]
            rows.append(
                [d_model, heads, length]
                + [f"{peaks[n]:.0f}" for n in IMPLEMENTATIONS]
                + [f"{peaks['ours'] / peaks['explicit']:.2f}"]
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--dims", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--heads", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 64, 256, 512])
    parser.add_argument("--memory-length", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--child", choices=IMPLEMENTATIONS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        memory_child(args)
        return
    device = torch.device(args.device)
    print(f"# attention, batch {args.batch}, {environment()}, device {device}\n")
    print("Time in ms (median of repeats); ratio < 1 means ours is faster.\n")
    print_table(
        [
            "d_model",
            "H",
            "T",
            "fwd ours",
            "fwd torch",
            "fwd explicit",
            "f+b ours",
            "f+b torch",
            "f+b explicit",
            "f+b ours/torch",
            "f+b ours/explicit",
        ],
        measure_times(args, device),
    )
    print(f"\nPeak memory of one forward+backward in MiB, length {args.memory_length}.\n")
    print_table(
        ["d_model", "H", "T", "ours", "torch", "explicit", "ours/explicit"], measure_memory(args)
    )


if __name__ == "__main__":
    main()
