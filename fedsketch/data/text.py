"""Generated short texts of ten topics: a large vocabulary whose gradients are sparse.

Words follow Zipf's law over a vocabulary of :data:`VOCAB` words (word ``t``
has weight ``(t + 1) ** -ZIPF``); every word belongs to one topic, drawn at
random. A document of topic ``c`` has :data:`DOC_LEN` words, each drawn with
probability :data:`TOPIC_SHARE` from topic ``c``'s own words (Zipf-weighted)
and otherwise from the whole vocabulary. The label is the topic.

Why it is here: the models of FetchSGD's language experiment (Rothchild et al.,
ICML 2020, Sec. 6, GPT-2 on PersonaChat) are mostly word embeddings, and a
batch's gradient touches only the rows of the words it holds, frequent words
far more than rare ones. Paired with the ``bag`` model (fastText's bag of
word embeddings, Joulin et al., EACL 2017) this is the sparse-gradient regime
of the regime map (docs/regime.md), generated from the seed, no download.

Words are stored as float32 ids (exact below 2**24) so that they travel the
same tensors as every other dataset; the ``bag`` model reads them as indices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

VOCAB = 100_000
DOC_LEN = 20
NUM_CLASSES = 10
ZIPF = 1.3
TOPIC_SHARE = 0.3
TRAIN_DOCS = 20_000
TEST_DOCS = 5_000
_STREAM = 0x7E47  # keeps this generator's random stream apart from the others'


@dataclass(frozen=True)
class TextSplit:
    """Generated documents: float32 word ids ``(N, DOC_LEN)`` and int64 topics."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def word_weights() -> np.ndarray:
    """Zipf's law over the vocabulary, normalized (float64)."""
    weights = np.arange(1, VOCAB + 1, dtype=np.float64) ** -ZIPF
    return weights / weights.sum()


def generate_text(seed: int) -> TextSplit:
    """:data:`TRAIN_DOCS` training and :data:`TEST_DOCS` test documents, deterministically in ``seed``.

    Topics are balanced in expectation in both splits (the partition decides
    how skewed each client is).

    Raises
    ------
    ValueError
        If ``seed`` is negative.
    """
    if seed < 0:
        raise ValueError(f"seed must be >= 0; got {seed}")
    rng = np.random.default_rng([seed, _STREAM])
    background = word_weights()
    topic_of_word = rng.integers(0, NUM_CLASSES, VOCAB)
    labels = rng.integers(0, NUM_CLASSES, TRAIN_DOCS + TEST_DOCS)
    words = np.empty((labels.shape[0], DOC_LEN), dtype=np.float32)
    for c in range(NUM_CLASSES):
        rows = np.flatnonzero(labels == c)
        own = np.where(topic_of_word == c, background, 0.0)
        from_topic = rng.random((rows.size, DOC_LEN)) < TOPIC_SHARE
        drawn = np.where(
            from_topic,
            rng.choice(VOCAB, size=(rows.size, DOC_LEN), p=own / own.sum()),
            rng.choice(VOCAB, size=(rows.size, DOC_LEN), p=background),
        )
        words[rows] = drawn
    return TextSplit(words[:TRAIN_DOCS], labels[:TRAIN_DOCS], words[TRAIN_DOCS:], labels[TRAIN_DOCS:])
