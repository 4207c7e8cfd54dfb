"""The guided decoder's rules, apart from a model: grounded spans, list counts, repeated trigrams, sentences."""

from __future__ import annotations

from recsys.enrich.guided import Free, FreeList, _ends_sentence, _list_follows, _repeating, _span_continuations


def test_a_grounded_value_continues_a_span_from_a_word_start() -> None:
    source = "great lash mascara, blackest black"
    starts, ends = _span_continuations(source, "")
    assert {"g", "great", "great lash", "mascara", "black"} <= starts and "ash" not in starts and not ends
    after_black, ends = _span_continuations(source, "black")
    assert "est" in after_black and ends  # "black" ends a word (the last one); "blackest" goes on
    assert _span_continuations(source, "lack") == (set(), False)  # not from a word's start
    assert " mascara" in _span_continuations(source, "great lash")[0]


def test_a_list_asks_for_its_minimum_and_stops_at_its_maximum() -> None:
    keywords = FreeList(Free("keywords", 8), 3, 6)
    assert _list_follows(keywords, 0, ', "x": "') == (', "',)  # the first of at least three
    assert _list_follows(keywords, 2, ', "x": "') == (', "', '], "x": "')  # the third: another, or the end
    assert _list_follows(keywords, 5, ', "x": "') == ('], "x": "',)  # the sixth is the last


def test_repeats_and_sentences() -> None:
    assert _repeating([1, 2, 3, 1, 2]) == {3} and _repeating([1, 2]) == set()
    assert _ends_sentence("A red lip balm.") and not _ends_sentence("A 1.") and not _ends_sentence("Red.")
