"""Parallel text on disk and in memory: a shared vocabulary, the synthetic language pair, token batches.

The on-disk format is the one fairseq's ``preprocess`` reads and writes for raw text: one tokenized sentence per
line in ``<split>.<lang>`` (``train.en`` / ``train.de``, ``valid.*``, ``test.*``), and a dictionary
``dict.txt`` of ``<token> <count>`` lines, most frequent first. WMT17 EN-DE, tokenized and BPE-encoded, comes in
that shape; so does the synthetic pair this module generates.

The synthetic pair is NOT WMT: a small deterministic grammar (seeded) whose "German" side agrees in gender and
number with its nouns, marks verbs for person-number, and puts the verb last and adjectives after the noun.
A small Transformer learns it in minutes on a CPU, so BLEU rises from near 0 to a clear goal in a test.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)
SPLITS = ("train", "valid", "test")


@dataclass(frozen=True)
class Vocabulary:
    """Tokens by index; the four specials first (pad 0, bos 1, eos 2, unk 3), as fairseq's Dictionary."""

    tokens: tuple[str, ...]

    @property
    def index(self) -> dict[str, int]:
        return {t: i for i, t in enumerate(self.tokens)}

    @property
    def pad(self) -> int:
        return 0

    @property
    def bos(self) -> int:
        return 1

    @property
    def eos(self) -> int:
        return 2

    @property
    def unk(self) -> int:
        return 3

    def __len__(self) -> int:
        return len(self.tokens)

    def encode(self, sentence: str) -> list[int]:
        """The tokens' indices (unknown ones as unk), ending in eos."""
        index = self.index
        return [index.get(t, self.unk) for t in sentence.split()] + [self.eos]

    def decode(self, ids: Iterable[int]) -> str:
        """The tokens up to the first eos, specials dropped, joined by spaces."""
        words: list[str] = []
        for i in ids:
            if i == self.eos:
                break
            if i > self.unk:
                words.append(self.tokens[i])
        return " ".join(words)


def build_vocabulary(sentences: Iterable[str]) -> tuple[Vocabulary, Counter[str]]:
    """A shared vocabulary of every token in ``sentences``, most frequent first (ties by token)."""
    counts = Counter(t for s in sentences for t in s.split())
    ordered = sorted(counts, key=lambda t: (-counts[t], t))
    return Vocabulary(SPECIALS + tuple(ordered)), counts


def write_dictionary(path: Path, vocab: Vocabulary, counts: Counter[str]) -> None:
    """fairseq's ``dict.txt``: ``<token> <count>`` per line, specials left out (fairseq adds its own)."""
    path.write_text("".join(f"{t} {counts[t]}\n" for t in vocab.tokens[len(SPECIALS) :]))


def read_dictionary(path: Path) -> Vocabulary:
    """A ``dict.txt`` as :func:`write_dictionary` (or fairseq) wrote it; the specials go first."""
    tokens: list[str] = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        parts = line.rsplit(" ", 1)
        if len(parts) != 2 or not parts[1].isdigit():
            raise ValueError(f"{path}:{lineno}: expected '<token> <count>', got {line!r}")
        tokens.append(parts[0])
    return Vocabulary(SPECIALS + tuple(t for t in tokens if t not in SPECIALS))


# -- the synthetic language pair -------------------------------------------------------------------------------

#: English nouns with their German-like stem and gender.
NOUNS = {
    "dog": ("hund", "m"), "cat": ("katze", "f"), "house": ("haus", "n"), "child": ("kind", "n"),
    "man": ("mann", "m"), "woman": ("frau", "f"), "tree": ("baum", "m"), "car": ("wagen", "m"),
    "book": ("buch", "n"), "city": ("stadt", "f"), "bird": ("vogel", "m"), "door": ("tuer", "f"),
}  # fmt: skip
ADJECTIVES = {"big": "gross", "small": "klein", "old": "alt", "red": "rot", "new": "neu", "quiet": "still"}
#: English verb (3rd singular, plural) and the German-like stem.
VERBS = {
    "sees": ("see", "seh"), "likes": ("like", "mag"), "finds": ("find", "find"), "helps": ("help", "helf"),
    "follows": ("follow", "folg"), "knows": ("know", "kenn"),
}  # fmt: skip
PREPOSITIONS = {"near": "bei", "behind": "hinter", "with": "mit"}
#: Determiner by (definite, gender, number) in the target language's nominative / oblique case.
DETERMINERS = {
    (True, "m", "sg"): ("der", "den"), (True, "f", "sg"): ("die", "die"), (True, "n", "sg"): ("das", "das"),
    (False, "m", "sg"): ("ein", "einen"), (False, "f", "sg"): ("eine", "eine"), (False, "n", "sg"): ("ein", "ein"),
}  # fmt: skip
PLURAL_DETERMINER = {True: ("die", "die"), False: ("einige", "einige")}
ADJECTIVE_ENDING = {"m": "er", "f": "e", "n": "es", "pl": "en"}


@dataclass(frozen=True)
class Phrase:
    english: str
    german_nominative: str
    german_oblique: str
    plural: bool


def _noun_phrase(rng: random.Random) -> Phrase:
    noun = rng.choice(sorted(NOUNS))
    stem, gender = NOUNS[noun]
    plural, definite = rng.random() < 0.4, rng.random() < 0.6
    adjective = rng.choice(sorted(ADJECTIVES)) if rng.random() < 0.5 else None
    en_det = "the" if definite else ("some" if plural else "a")
    en = " ".join(w for w in (en_det, adjective, noun + ("s" if plural else "")) if w)
    nom, obl = PLURAL_DETERMINER[definite] if plural else DETERMINERS[(definite, gender, "sg")]
    de_noun = stem + ("en" if plural else "")
    # Adjectives follow the noun and agree with its gender (or plural): the pair's reordering and agreement.
    de_adj = ADJECTIVES[adjective] + ADJECTIVE_ENDING["pl" if plural else gender] if adjective else None
    tail = " ".join(w for w in (de_noun, de_adj) if w)
    return Phrase(en, f"{nom} {tail}", f"{obl} {tail}", plural)


def synthetic_pair(rng: random.Random) -> tuple[str, str]:
    """One sentence pair: subject verb object [preposition noun-phrase] in English, verb-final in the target."""
    subject, obj = _noun_phrase(rng), _noun_phrase(rng)
    verb = rng.choice(sorted(VERBS))
    plural_form, stem = VERBS[verb]
    en = [subject.english, plural_form if subject.plural else verb, obj.english]
    de_verb = stem + ("en" if subject.plural else "t")
    de = [subject.german_nominative, obj.german_oblique]
    if rng.random() < 0.4:
        preposition = rng.choice(sorted(PREPOSITIONS))
        extra = _noun_phrase(rng)
        en += [preposition, extra.english]
        de += [PREPOSITIONS[preposition], extra.german_oblique]
    return " ".join(en), " ".join([*de, de_verb])


def synthetic_corpus(n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` sentence pairs, the same for the same seed on every machine."""
    rng = random.Random(seed)
    return [synthetic_pair(rng) for _ in range(n)]


def write_synthetic(root: Path, sizes: dict[str, int], seed: int = 0, src: str = "en", tgt: str = "de") -> Path:
    """The synthetic pair under ``root`` in the raw-text format (``<split>.<lang>`` and ``dict.txt``).

    Each split has its own seed (seed, seed + 1, ...), so test sentences are new draws, not copies of training.
    """
    root.mkdir(parents=True, exist_ok=True)
    everything: list[str] = []
    for offset, split in enumerate(SPLITS):
        if split not in sizes:
            continue
        pairs = synthetic_corpus(sizes[split], seed + offset)
        for lang, side in ((src, 0), (tgt, 1)):
            (root / f"{split}.{lang}").write_text("".join(p[side] + "\n" for p in pairs))
        everything += [s for p in pairs for s in p]
    vocab, counts = build_vocabulary(everything)
    write_dictionary(root / "dict.txt", vocab, counts)
    return root


# -- reading parallel text -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParallelText:
    """One split: sentences as token ids (each ending in eos), and the raw target lines (BLEU's references)."""

    source: list[list[int]]
    target: list[list[int]]
    references: list[str]


def merge_bpe(text: str) -> str:
    """Subword-nmt's pieces joined: ``Kat@@ ze`` is ``Katze`` (text without ``@@`` is unchanged)."""
    return (text + " ").replace("@@ ", "").rstrip(" ")


def read_split(
    root: Path, split: str, vocab: Vocabulary, *, src: str = "en", tgt: str = "de", max_tokens: int | None = None
) -> ParallelText:
    """``<split>.<src>`` and ``<split>.<tgt>`` line by line; pairs with a side longer than ``max_tokens`` (eos
    counted) are dropped, as the recipe trains on sentences of at most 80 tokens. BLEU's references are the lines
    of ``<split>.ref.<tgt>`` (detokenized text) where that file exists, else the target lines with BPE merged."""
    sources = (root / f"{split}.{src}").read_text().splitlines()
    targets = (root / f"{split}.{tgt}").read_text().splitlines()
    if len(sources) != len(targets):
        raise ValueError(f"{root}/{split}: {len(sources)} {src} lines but {len(targets)} {tgt} lines")
    ref_file = root / f"{split}.ref.{tgt}"
    refs = ref_file.read_text().splitlines() if ref_file.exists() else [merge_bpe(t) for t in targets]
    if len(refs) != len(targets):
        raise ValueError(f"{ref_file}: {len(refs)} references for {len(targets)} {tgt} lines")
    out = ParallelText([], [], [])
    for s, t, ref in zip(sources, targets, refs, strict=True):
        s_ids, t_ids = vocab.encode(s), vocab.encode(t)
        if max_tokens is not None and max(len(s_ids), len(t_ids)) > max_tokens:
            continue
        out.source.append(s_ids)
        out.target.append(t_ids)
        out.references.append(ref)
    return out


def pad_batch(rows: Sequence[Sequence[int]], pad: int) -> torch.Tensor:
    """Rows right-padded with ``pad`` into one (batch, longest) int64 tensor."""
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out


def token_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Sentence indices grouped, by length, into batches of at most ``max_tokens`` padded tokens each (fairseq's
    ``--max-tokens``); a sentence longer than ``max_tokens`` gets a batch of its own."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and lengths[i] * (len(current) + 1) > max_tokens:  # sorted: lengths[i] is the longest
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches
