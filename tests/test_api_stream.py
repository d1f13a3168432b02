"""TextStream: the streamed pieces join to exactly the text output.texts holds, also when a
multi-byte character is split across cycles or the reply ends inside one (a byte tokenizer
stands in for a real one: no model loads)."""

from __future__ import annotations

import pytest

from eagle_kernels.runtime.api import TextStream


class ByteTokenizer:
    """Token i decodes to ``pieces[i]`` bytes; the text is their UTF-8 decoding with invalid
    or incomplete sequences replaced by U+FFFD, as byte-level BPE tokenizers decode."""

    def __init__(self, pieces: list[bytes]):
        self.pieces = pieces

    def decode(self, ids, skip_special_tokens=True):
        return b"".join(self.pieces[i] for i in ids).decode("utf-8", errors="replace")


class Output:
    def __init__(self, tokens):
        self.tokens, self.stop_reasons, self.stats = tokens, ["max_new_tokens"], None


class TokenStream:
    """What Engine.stream returns: one batch-of-one item per cycle, then ``output``."""

    def __init__(self, cycles: list[list[int]]):
        self._cycles = iter(cycles)
        self.output = Output([[token for cycle in cycles for token in cycle]])

    def __iter__(self):
        return self

    def __next__(self):
        return [next(self._cycles)]


@pytest.mark.parametrize("pieces,cycles,expected", [
    # the reply ends mid-character: the last piece was held back and never shown
    ([b"hi ", b"there \xe2"], [[0], [1]], ["hi ", "there ", "\ufffd"]),
    # a character split across cycles: the text before it is not held back with it
    ([b"a\xe2\x82", b"\xacb"], [[0], [1]], ["a", "\u20acb"]),
    ([b"x", b"\xe2", b"\x82", b"\xac"], [[0, 1], [2], [3]], ["x", "\u20ac"]),
    ([b"ok"], [[0], []], ["ok"]),
])
def test_streamed_pieces_join_to_the_output_text(pieces, cycles, expected):
    tokenizer = ByteTokenizer(pieces)
    stream = TextStream(tokenizer, TokenStream(cycles))
    shown = list(stream)
    assert shown == expected
    assert "".join(shown) == stream.output.texts[0]
