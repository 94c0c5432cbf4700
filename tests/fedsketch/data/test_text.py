"""The generated texts and the ``bag`` model: deterministic, Zipf-shaped, learnable, and sparse in gradient."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedsketch.config import ConfigError, RunConfig
from fedsketch.data import text
from fedsketch.model.models import BAG_DIM, build_model


@pytest.fixture
def split() -> text.TextSplit:
    """Made for each test (0.1 s): mutation testing credits what a module-scoped fixture runs to its first test."""
    return text.generate_text(0)


def test_the_texts_are_a_pure_function_of_the_seed(split: text.TextSplit) -> None:
    again = text.generate_text(0)
    assert np.array_equal(split.x_train, again.x_train) and np.array_equal(split.y_test, again.y_test)
    assert not np.array_equal(split.x_train, text.generate_text(1).x_train)
    with pytest.raises(ValueError, match="seed must be >= 0"):
        text.generate_text(-1)


def test_documents_are_word_ids_of_the_vocabulary_with_balanced_topics(split: text.TextSplit) -> None:
    assert split.x_train.shape == (text.TRAIN_DOCS, text.DOC_LEN) and split.x_train.dtype == np.float32
    assert split.x_test.shape == (text.TEST_DOCS, text.DOC_LEN)
    ids = np.concatenate([split.x_train.ravel(), split.x_test.ravel()])
    assert np.array_equal(ids, np.round(ids)) and ids.min() >= 0 and ids.max() < text.VOCAB
    for labels in (split.y_train, split.y_test):
        counts = np.bincount(labels, minlength=text.NUM_CLASSES)
        assert counts.min() > 0.8 * labels.size / text.NUM_CLASSES


def test_word_frequencies_follow_zipfs_law(split: text.TextSplit) -> None:
    counts = np.bincount(split.x_train.astype(np.int64).ravel(), minlength=text.VOCAB)
    # Word t is drawn with weight (t + 1) ** -ZIPF (the topic draws follow the same weights):
    # the slope of log count against log rank over the frequent words is -ZIPF.
    ranks = np.arange(1, 201)
    slope = np.polyfit(np.log(ranks), np.log(counts[:200] + 1), 1)[0]
    assert slope == pytest.approx(-text.ZIPF, abs=0.15)
    assert (counts > 0).sum() < text.VOCAB / 2  # a long tail of words the training set never holds
    assert np.sort(counts)[::-1][:100].sum() > 0.7 * counts.sum()  # the 100 most frequent: 81 % of Zipf's weight


def test_word_weights_are_zipfs_law_normalized() -> None:
    weights = text.word_weights()
    assert weights.dtype == np.float64 and weights.shape == (text.VOCAB,) and weights.sum() == pytest.approx(1.0)
    ranks = np.array([1, 2, 10, 1000, text.VOCAB])
    np.testing.assert_allclose(weights[ranks - 1] / weights[0], ranks**-text.ZIPF, rtol=1e-12)


def test_each_frequent_word_is_more_frequent_in_the_documents_of_its_one_topic(split: text.TextSplit) -> None:
    """A topic's documents draw TOPIC_SHARE of their words from that topic's own: each of the 100 most frequent
    words is clearly more frequent in one topic's documents than in the other nine, which are alike."""
    words, labels = split.x_train.astype(np.int64), split.y_train
    top = np.argsort(-np.bincount(words.ravel(), minlength=text.VOCAB))[:100]
    per_doc = np.stack(
        [np.bincount(words[labels == c].ravel(), minlength=text.VOCAB)[top] / (labels == c).sum() for c in range(10)]
    )
    ranked = np.sort(per_doc, axis=0)
    lift = ranked[-1] / np.median(ranked[:-1], axis=0)
    assert lift.min() > 1.3 and np.median(lift) > 4


def test_a_document_is_drawn_word_by_word(split: text.TextSplit) -> None:
    distinct = [np.unique(doc).size for doc in split.x_train[:2000]]
    assert 10 < np.mean(distinct) < text.DOC_LEN


def test_the_bag_model_reads_word_ids_and_is_seeded() -> None:
    model = build_model("bag", (text.DOC_LEN,), text.NUM_CLASSES, seed=3)
    assert sum(p.numel() for p in model.parameters()) == text.VOCAB * BAG_DIM + BAG_DIM * 10 + 10 == 800_090
    again = build_model("bag", (text.DOC_LEN,), text.NUM_CLASSES, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(), strict=True))
    ids = torch.randint(0, text.VOCAB, (4, text.DOC_LEN))
    assert torch.equal(model(ids.float()), model(ids))
    with pytest.raises(ValueError, match="word ids"):
        build_model("bag", (1, 28, 28), 10)


def test_a_batch_gradient_touches_only_the_rows_of_its_words(split: text.TextSplit) -> None:
    model = build_model("bag", (text.DOC_LEN,), text.NUM_CLASSES)
    x, y = torch.from_numpy(split.x_train[:64]), torch.from_numpy(split.y_train[:64])
    F.cross_entropy(model(x), y).backward()
    grad = model.embedding.weight.grad
    assert grad is not None
    touched = torch.unique(x.long())
    rows = grad.abs().sum(dim=1) > 0
    assert set(torch.nonzero(rows).ravel().tolist()) == set(touched.tolist())
    assert rows.sum() * BAG_DIM < 0.02 * text.VOCAB * BAG_DIM  # under 2% of the embedding coordinates


def test_the_topics_are_learnable_from_the_words(split: text.TextSplit) -> None:
    # Count how often each word appears under each topic on the training set; a document's topic is then
    # the topic its words were most often seen in. Far above chance (0.1) on the test set.
    words = split.x_train.astype(np.int64)
    table = np.zeros((text.VOCAB, text.NUM_CLASSES))
    np.add.at(table, (words.ravel(), np.repeat(split.y_train, text.DOC_LEN)), 1.0)
    votes = np.log(table + 1.0)[split.x_test.astype(np.int64)].sum(axis=1)
    assert (votes.argmax(axis=1) == split.y_test).mean() > 0.7


def test_the_texts_go_with_the_bag_model_only() -> None:
    RunConfig.from_mapping({"dataset": "synthetic_text", "model": "bag"})
    with pytest.raises(ConfigError, match="does not fit 'dataset'"):
        RunConfig.from_mapping({"dataset": "synthetic_text"})
    with pytest.raises(ConfigError, match="does not fit 'dataset'"):
        RunConfig.from_mapping({"model": "bag"})
