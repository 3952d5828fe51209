"""Attention heat maps with matplotlib: one panel per layer and head (encoder self-attention,
cross-attention, decoder self-attention)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor


def attention_figure(
    cross: Sequence[Tensor],
    self_attn: Sequence[Tensor],
    source_tokens: Sequence[str],
    output_tokens: Sequence[str],
    title: str = "",
    encoder: Sequence[Tensor] = (),
):
    """A figure of the attention of one example.

    Args:
        cross: per decoder layer, the cross-attention weights (H, T, S).
        self_attn: per decoder layer, the decoder self-attention weights (H, T, T).
        source_tokens: the S source token labels; output_tokens: the T decoder input labels
            (BOS and the generated tokens, each row predicting the next).
        encoder: per encoder layer, the encoder self-attention weights (H, S, S).

    Returns:
        A matplotlib Figure: the encoder's self-attention layers on top, then the
        cross-attention layers, then the decoder's self-attention layers; one column per head,
        each panel with token labels, and one shared colour bar.
    """
    import matplotlib

    matplotlib.use("Agg")  # files, not windows: works with no display
    import matplotlib.pyplot as plt

    layers = [("encoder self-attention", w) for w in encoder]
    layers += [("cross-attention", w) for w in cross] + [("self-attention", w) for w in self_attn]
    first = {kind: next(i for i, (k, _) in enumerate(layers) if k == kind) for kind, _ in layers}
    heads = layers[0][1].size(0)
    cell = 0.32
    width = max(3.0, cell * max(len(source_tokens), len(output_tokens)) + 1.2)
    height = max(2.5, cell * len(output_tokens) + 1.2)
    fig, axes = plt.subplots(
        len(layers),
        heads,
        figsize=(width * heads + 1.0, height * len(layers)),
        squeeze=False,
        layout="constrained",  # keeps titles, tick labels and the colour bar apart
    )
    image = None
    for row, (kind, weights) in enumerate(layers):
        layer = row - first[kind]
        keys = output_tokens if kind == "self-attention" else source_tokens
        queries = source_tokens if kind == "encoder self-attention" else output_tokens
        query_label = "source" if kind == "encoder self-attention" else "decoder input"
        for head in range(heads):
            ax = axes[row][head]
            image = ax.imshow(
                weights[head].float().cpu().numpy(), vmin=0.0, vmax=1.0, cmap="viridis"
            )
            ax.set_title(f"{kind}, layer {layer}, head {head}", fontsize=9)
            ax.set_xticks(range(len(keys)), labels=keys, rotation=90, fontsize=8)
            ax.set_yticks(range(len(queries)), labels=queries, fontsize=8)
            ax.set_xlabel("decoder input" if kind == "self-attention" else "source", fontsize=8)
            if head == 0:
                ax.set_ylabel(query_label, fontsize=8)
    fig.colorbar(image, ax=axes, shrink=0.6, label="attention probability")
    if title:
        fig.suptitle(title)
    return fig


def model_view_figure(layers: Sequence[Tensor], title: str = "", kind: str = "cross"):
    """Every layer and head of one attention kind at once (bertviz's model view): a row a
    layer, a column a head, small heat maps without labels, as the page's grid draws them.

    Args:
        layers: per layer, the weights (H, Tq, Tk).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heads = layers[0].size(0)
    rows, cols = layers[0].shape[1:]
    size = 1.3
    fig, axes = plt.subplots(
        len(layers), heads, figsize=(size * heads + 1.0, size * len(layers) * rows / cols + 0.8),
        squeeze=False, layout="constrained",
    )  # fmt: skip
    image = None
    for layer, weights in enumerate(layers):
        for head in range(heads):
            ax = axes[layer][head]
            image = ax.imshow(weights[head].float().cpu().numpy(), vmin=0.0, vmax=1.0, cmap="Blues")
            ax.set_xticks([])
            ax.set_yticks([])
            if layer == 0:
                ax.set_title(f"head {head}", fontsize=8)
            if head == 0:
                ax.set_ylabel(f"layer {layer}", fontsize=8)
    fig.colorbar(image, ax=axes, shrink=0.6, label=f"{kind} attention probability")
    if title:
        fig.suptitle(title, fontsize=9)
    return fig
