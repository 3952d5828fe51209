"""The training doctor: at each validation, the degenerate outputs users of seq2seq toolkits
keep reporting, counted as metrics and said in plain words.

    val/distinct_rate   distinct outputs over outputs (1: all different; near 0: one for all)
    val/repeat_rate     outputs that repeat themselves: a word 3-gram twice, or a token 3 times
                        in a row ("in the snow with snow in the snow")
    val/no_eos_rate     outputs that never ended: cut off at the length limit
    val/len_ratio       output length over reference length, in characters (brevity or babble)

`diagnose` turns them, with the run's history of loss and BLEU, into warnings, each naming
what it sees and what usually helps. The thresholds are rules of thumb, not proofs: a
warning is a place to look.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

SAME_OUTPUT = 0.5  # warn when one text is more than half of the outputs
REPEATS = 0.05  # ... more than 5% of outputs repeat themselves (and more than the references)
NO_EOS = 0.02  # ... more than 2% never end
LENGTH = (0.8, 1.2)  # ... the length ratio leaves this band
NEAR_ZERO_BLEU = 0.01  # ... BLEU below this while the loss has fallen by FALLEN
FALLEN = 0.2


def repeats_itself(text: str) -> bool:
    """A word 3-gram that occurs twice, or one token three times in a row."""
    words = text.split()
    trigrams = [tuple(words[i : i + 3]) for i in range(len(words) - 2)]
    if len(trigrams) != len(set(trigrams)):
        return True
    return any(words[i] == words[i + 1] == words[i + 2] for i in range(len(words) - 2))


def output_metrics(
    hypotheses: Sequence[str], references: Sequence[str], ended: Sequence[bool]
) -> dict[str, float]:
    """The doctor's metrics of one validation (names without the stage prefix)."""
    n = len(hypotheses)
    if n == 0:
        return {}
    reference_chars = sum(len(r) for r in references)
    return {
        "distinct_rate": len(set(hypotheses)) / n,
        "repeat_rate": sum(map(repeats_itself, hypotheses)) / n,
        "no_eos_rate": sum(not e for e in ended) / n,
        "len_ratio": sum(len(h) for h in hypotheses) / max(reference_chars, 1),
    }


@dataclass
class Doctor:
    """Keeps the run's validation history and says what looks wrong at each validation."""

    losses: list[float] = field(default_factory=list)

    def diagnose(
        self,
        hypotheses: Sequence[str],
        references: Sequence[str],
        ended: Sequence[bool],
        loss: float | None = None,
        bleu: float | None = None,
    ) -> tuple[dict[str, float], list[str]]:
        """(metrics, warnings) of one validation's outputs."""
        metrics = output_metrics(hypotheses, references, ended)
        if loss is not None:
            self.losses.append(loss)
        if not metrics:
            return metrics, []
        n = len(hypotheses)
        warnings = []
        text, count = Counter(hypotheses).most_common(1)[0]
        if n >= 10 and count / n > SAME_OUTPUT:
            warnings.append(
                f"{count / n:.0%} of the outputs are the same text ({text[:60]!r}): the model "
                "is not using its source yet; train longer, or check that sources and targets "
                "are aligned"
            )
        reference_repeats = sum(map(repeats_itself, references)) / n
        if metrics["repeat_rate"] > max(REPEATS, 2 * reference_repeats):
            warnings.append(
                f"{metrics['repeat_rate']:.0%} of the outputs repeat themselves (the references: "
                f"{reference_repeats:.0%}): under-trained; beam search with a length penalty "
                "and more training usually help"
            )
        if metrics["no_eos_rate"] > NO_EOS:
            warnings.append(
                f"{metrics['no_eos_rate']:.0%} of the outputs never end (cut at the length "
                "limit, model.decoding.max_len_a/b): they loop or babble"
            )
        low, high = LENGTH
        if not low <= metrics["len_ratio"] <= high:
            side = "shorter" if metrics["len_ratio"] < low else "longer"
            warnings.append(
                f"the outputs are {metrics['len_ratio']:.2f}x the references' length ({side}); "
                "BLEU's brevity penalty and chrF suffer; model.decoding.length_penalty moves beam "
                "search's outputs"
            )
        fallen = len(self.losses) >= 3 and self.losses[-1] < (1 - FALLEN) * self.losses[0]
        if bleu is not None and bleu < NEAR_ZERO_BLEU and fallen:
            warnings.append(
                f"BLEU is near zero ({bleu:.4f}) while the validation loss fell from "
                f"{self.losses[0]:.3f} to {self.losses[-1]:.3f}: the model learns the targets' "
                "language but not the translation; check the data's alignment and the tokenizer"
            )
        return metrics, warnings
