"""Corpus BLEU from sacrebleu on detokenized text, with the signature that says how it was computed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sacrebleu.metrics import BLEU


@dataclass(frozen=True)
class BleuScore:
    score: float  #: corpus BLEU, 0..100
    signature: str  #: sacrebleu's, e.g. ``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0``


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str], tokenize: str = "13a") -> BleuScore:
    """BLEU of detokenized ``hypotheses`` against one detokenized reference each (sacrebleu's defaults: 13a
    tokenization, exponential smoothing, case-sensitive), as WMT reports it."""
    if len(hypotheses) != len(references):
        raise ValueError(f"bleu: {len(hypotheses)} hypotheses for {len(references)} references")
    metric = BLEU(tokenize=tokenize)
    result = metric.corpus_score(list(hypotheses), [list(references)])
    return BleuScore(result.score, str(metric.get_signature()))
