"""WikiText's token files (``wiki.train.tokens``, ``wiki.valid.tokens``, ``wiki.test.tokens``) in and out.

A file is read the way the AWD-LSTM reference reads it: every line (blank lines and `` = Heading = `` lines
included) split on whitespace, with ``<eos>`` appended; the vocabulary is the training file's words in order of
first appearance. WikiText-2 already writes its rare words as ``<unk>``, and its validation and test words all
occur in training; a word of another split that training lacks becomes ``<unk>`` where the vocabulary has it (and
is counted), else the file is refused with the word named.

:func:`write_synthetic` writes a generated corpus in the same format: a seeded grammar with number agreement, NOT
WikiText-2, small enough that an AWD-LSTM learns it in minutes on a CPU.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch

EOS = "<eos>"
UNK = "<unk>"
SPLITS = ("train", "valid", "test")


def split_file(root: Path, split: str) -> Path:
    return root / f"wiki.{split}.tokens"


def line_words(line: str) -> list[str]:
    return [*line.split(), EOS]


@dataclass(frozen=True)
class Vocabulary:
    words: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "index", {w: i for i, w in enumerate(self.words)})

    def __len__(self) -> int:
        return len(self.words)

    def id_of(self, word: str) -> int | None:
        index: dict[str, int] = self.index  # type: ignore[attr-defined]
        return index.get(word)


def build_vocabulary(path: Path) -> Vocabulary:
    """The words of ``path`` (``<eos>`` included) in order of first appearance."""
    seen: dict[str, None] = {}
    with path.open(encoding="utf-8") as f:
        for line in f:
            for word in line_words(line):
                seen.setdefault(word, None)
    return Vocabulary(tuple(seen))


@dataclass(frozen=True)
class TokenIds:
    ids: torch.Tensor  #: 1-D int64
    unknown: int  #: words of the file the vocabulary lacked, read as <unk>


def read_tokens(path: Path, vocab: Vocabulary) -> TokenIds:
    """``path``'s words as ids; a word the vocabulary lacks is ``<unk>`` (counted), or a ValueError without one."""
    unk = vocab.id_of(UNK)
    ids: list[int] = []
    unknown = 0
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            for word in line_words(line):
                found = vocab.id_of(word)
                if found is None:
                    if unk is None:
                        raise ValueError(f"{path.name}:{number}: {word!r} is not in the training vocabulary (no <unk>)")
                    found, unknown = unk, unknown + 1
                ids.append(found)
    return TokenIds(torch.tensor(ids, dtype=torch.long), unknown)


@dataclass(frozen=True)
class LanguageCorpus:
    vocab: Vocabulary
    train: torch.Tensor
    valid: torch.Tensor
    test: torch.Tensor
    unknown: int  #: words of valid and test read as <unk> for want of a training occurrence


def read_corpus(root: Path) -> LanguageCorpus:
    """The three token files under ``root``; each one missing is named."""
    for split in SPLITS:
        if not split_file(root, split).is_file():
            raise FileNotFoundError(f"dataset.path: {split_file(root, split)} is missing (WikiText's token files)")
    vocab = build_vocabulary(split_file(root, "train"))
    train, valid, test = (read_tokens(split_file(root, s), vocab) for s in SPLITS)
    return LanguageCorpus(vocab, train.ids, valid.ids, test.ids, valid.unknown + test.unknown)


def batchify(ids: torch.Tensor, streams: int, rank: int = 0, world: int = 1) -> torch.Tensor:
    """This rank's ``(time, streams)`` block: the corpus cut into ``streams * world`` contiguous streams of equal
    length (the remainder dropped), rank r taking streams ``r*streams .. (r+1)*streams - 1``. Every rank gets the
    same number of tokens, hence of BPTT steps, and k ranks of b streams see what one rank of k*b streams sees."""
    total = streams * world
    length = ids.numel() // total
    if length < 2:
        raise ValueError(f"batchify: {ids.numel()} tokens cannot fill {total} streams of at least 2 tokens")
    block = ids[: length * total].reshape(total, length).t()
    return block[:, rank * streams : (rank + 1) * streams].contiguous()


# -- the synthetic corpus (NOT WikiText-2) -------------------------------------------------------------------------
NOUNS = ("cat", "dog", "bird", "horse", "child", "king", "ship", "river", "city", "tree", "farmer", "queen")
ADJECTIVES = ("old", "small", "red", "quiet", "brave", "green")
VERBS = (("sees", "see"), ("likes", "like"), ("follows", "follow"), ("finds", "find"), ("helps", "help"))
PLACES = ("the valley", "the north", "the harbour", "the forest")


def _noun_phrase(rng: random.Random) -> tuple[list[str], bool]:
    plural = rng.random() < 0.4
    noun = rng.choice(NOUNS)
    words = ["the"] + ([rng.choice(ADJECTIVES)] if rng.random() < 0.5 else [])
    word = noun + "s" if plural else noun
    if rng.random() < 0.03:
        word = UNK  # as WikiText writes its rare words
    return [*words, word], plural


def synthetic_sentence(rng: random.Random) -> list[str]:
    """``the [adj] noun(s) verb(s) the [adj] noun(s) [in PLACE] .``, the verb agreeing with the subject."""
    subject, plural = _noun_phrase(rng)
    verb = rng.choice(VERBS)[1 if plural else 0]
    obj, _ = _noun_phrase(rng)
    tail = ["in", *rng.choice(PLACES).split()] if rng.random() < 0.3 else []
    return [*subject, verb, *obj, *tail, "."]


def synthetic_lines(count: int, rng: random.Random) -> list[str]:
    """WikiText's layout: a `` = Heading = `` line, blank lines around it, paragraphs of 1-3 sentences."""
    lines: list[str] = []
    while len(lines) < count:
        if rng.random() < 0.1:
            lines += ["", f" = {rng.choice(NOUNS).title()} = ", ""]
            continue
        sentences = [" ".join(synthetic_sentence(rng)) for _ in range(rng.randint(1, 3))]
        lines.append(" " + " ".join(sentences) + " ")
    return lines[:count]


def write_synthetic(root: Path, lines: dict[str, int], seed: int = 0) -> Path:
    """``wiki.<split>.tokens`` for ``lines`` = {split: line count} under ``root``, the same for the same seed."""
    root.mkdir(parents=True, exist_ok=True)
    for offset, split in enumerate(SPLITS):
        rng = random.Random(seed * 1_000_003 + offset)
        text = "\n".join(synthetic_lines(lines[split], rng)) + "\n"
        split_file(root, split).write_text(text, encoding="utf-8")
    return root
