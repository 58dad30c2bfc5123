"""IncrementalText's stop strings against a plain reference: the text released after each add (a held-back tail that
may still grow into a stop string, a broken UTF-8 character), where it stops and how many tokens count, for random
byte streams cut into random groups (as a server's groups of decode steps hand them over)."""

import random

from redline.inference.text import IncrementalText
from redline.tokenizer import load_tokenizer


class Reference:
    """The whole text decoded at each add, every tail length tried for every stop string."""

    def __init__(self, tokenizer, stops):
        self.tokenizer, self.stops = tokenizer, [s for s in stops if s]
        self.ids, self.released, self.stopped, self.final_tokens = [], 0, False, None

    def add(self, ids) -> str:
        if self.stopped:
            return ""
        self.ids += ids
        full = self.tokenizer.decode(self.ids)
        hits = [i for i in (full.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped, self.final_tokens = True, len(self.ids)
            out, self.released = full[self.released:min(hits)], max(self.released, min(hits))
            return out
        end = len(full)
        while end > self.released and full[end - 1] == "\ufffd":
            end -= 1
        for s in self.stops:
            for k in range(min(len(s) - 1, end - self.released), 0, -1):
                if s.startswith(full[end - k:end]):
                    end -= k
                    break
        out, self.released = full[self.released:end], end
        return out


def test_released_text_matches_the_reference():
    tokenizer = load_tokenizer("bytes")
    rng = random.Random(0)
    alphabet = "abab a\n\n é€"  # repeats, so that stop strings' prefixes keep turning up; multi-byte characters
    for case in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 4))) for _ in range(rng.randint(0, 3))]
        ids = list(text.encode())
        mine, ref = IncrementalText(tokenizer, stops), Reference(tokenizer, stops)
        i = 0
        while i < len(ids):
            n = rng.randint(1, 8)
            assert mine.add(ids[i:i + n]) == ref.add(ids[i:i + n]), (case, text, stops, i)
            assert (mine.stopped, mine.final_tokens, mine.released) == (ref.stopped, ref.final_tokens, ref.released)
            i += n
