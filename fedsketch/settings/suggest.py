"""What an unknown setting key most likely meant: by its words as well as by its spelling.

``difflib`` finds keys spelt alike (``sketch-colz`` -> ``sketch-cols``), but a
key written from memory is often other words for the same thing: ``num-rows``
is spelt like ``num-rounds`` and means ``sketch-rows``. So a known key also
scores by the words it shares with the unknown one (in its own name, and, at
half weight, in its one-line meaning), each word weighted by how few keys it
appears in: ``rows`` points at one key, ``num`` at three. A key's name may shorten
the word asked (``cols`` for ``columns``).
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from collections.abc import Mapping

MEANING_FLOOR = 0.5
"""The least score a key needs to be suggested for its words: one word it shares with at most two keys' names."""


def _words(text: str) -> set[str]:
    """Lower-case words of at least two letters, a plural ``s`` dropped (``rows`` and ``row`` meet)."""
    return {w[:-1] if len(w) > 3 and w.endswith("s") else w for w in re.findall(r"[a-z]{2,}", text.lower())}


def by_meaning(key: str, known: Mapping[str, str]) -> str | None:
    """The known key (of ``known``: key -> its meaning) that shares the most telling words with ``key``."""
    asked = _words(key)
    names = {k: _words(k) for k in known}
    docs = {k: _words(doc) for k, doc in known.items()}
    in_names = Counter(w for ws in names.values() for w in ws)
    in_docs = Counter(w for ws in docs.values() for w in ws)
    scores = {
        k: sum(1 / in_names[w] for w in _shared(asked, names[k])) + sum(0.5 / in_docs[w] for w in asked & docs[k])
        for k in known
    }
    best = max(scores, key=lambda k: (scores[k], -len(k)), default=None)
    return best if best is not None and scores[best] >= MEANING_FLOOR else None


def _shared(asked: set[str], name: set[str]) -> set[str]:
    """The words of a key's ``name`` that the asked words spell out or shorten (``col`` of ``sketch-cols`` for
    ``columns``; three letters at least)."""
    return {
        w for w in name for a in asked if a == w or (min(len(a), len(w)) >= 3 and (a.startswith(w) or w.startswith(a)))
    }


def suggestions(key: str, known: Mapping[str, str]) -> list[str]:
    """At most two keys ``key`` may have meant: by meaning first, then by spelling."""
    out = [k for k in (by_meaning(key, known), *difflib.get_close_matches(key, list(known), n=1)) if k]
    return list(dict.fromkeys(out))


def hint(key: str, known: Mapping[str, str]) -> str:
    """`` (did you mean 'a' or 'b'?)``, or ``''`` when nothing is near."""
    near = suggestions(key, known)
    return f" (did you mean {' or '.join(repr(k) for k in near)}?)" if near else ""
