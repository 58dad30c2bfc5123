"""Which token prefixes the rows of a decode batch hold in their KV cache, found by hashing blocks of tokens.

Every row of a DecodeBatch keeps its sequence's keys and values at slots [0, n) after the sequence ends, until the
row is prefilled again: a later prompt that starts with the same tokens (a chat's history sent again with one more
turn, a shared system prompt, the other choices of a request with n > 1) can copy those slots from that row instead
of computing them (DecodeBatch.copy_prefix). This index maps the tokens to the rows that hold them:

    index.set(row, tokens)                  # row's cache holds `tokens` at slots [0, len(tokens))
    row, n = index.match(prompt)            # some row holds prompt[:n], n a multiple of BLOCK (0: none)

Tokens are hashed in blocks of BLOCK, each block's hash chained to the one before it (as vLLM's automatic prefix
caching hashes its KV blocks), so a match costs a dictionary lookup per block of the prompt. The dictionary keeps
the rows registered with each chained hash; a row whose content changed since is caught by comparing its own
current hash at that block, so a stale entry is never returned.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

BLOCK = 16  # tokens a hash covers: matches are whole blocks


def chain_hashes(tokens: Sequence[int], known: Sequence[int] = ()) -> list[int]:
    """The chained hashes of tokens' whole blocks: hashes[i] stands for tokens[:(i + 1) * BLOCK]. known: the hashes
    of its first blocks, computed before (a sequence that grew), which are not hashed again."""
    n = len(tokens) // BLOCK
    out = list(known[:n])
    h = out[-1] if out else 0
    for i in range(len(out), n):
        h = hash((h, tuple(tokens[i * BLOCK:(i + 1) * BLOCK])))
        out.append(h)
    return out


class PrefixIndex:
    """The chained block hashes of what each row holds, and the rows registered with each hash."""

    def __init__(self, rows: int):
        self.hashes: list[list[int]] = [[] for _ in range(rows)]  # each row's chained block hashes
        self.owners: dict[int, dict[int, None]] = {}  # chained hash -> the rows registered with it (in order)
        self.live = 0  # hashes the rows hold now: the dictionary is rebuilt when it outgrows them

    def set(self, row: int, tokens: Sequence[int], grew: bool = False) -> None:
        """Row's cache now holds `tokens` at slots [0, len(tokens)) (only whole blocks are indexed). grew: the row
        held the first of these already (its sequence went on): their hashes are kept, not computed again."""
        known = self.hashes[row] if grew else ()
        self.set_hashes(row, chain_hashes(tokens, known=known), registered=len(known))

    def set_hashes(self, row: int, hashes: list[int], registered: int = 0) -> None:
        """set() with the hashes known already (a prefix of another row's); the first `registered` of them are the
        row's in the dictionary already."""
        self.live += len(hashes) - len(self.hashes[row])
        self.hashes[row] = hashes
        for h in hashes[registered:]:
            self.owners.setdefault(h, {})[row] = None
        if len(self.owners) > 2 * self.live + 4096:  # drop the stale entries now and then
            self.owners = {}
            for r, row_hashes in enumerate(self.hashes):
                for h in row_hashes:
                    self.owners.setdefault(h, {})[r] = None

    def match(self, tokens: Sequence[int], exclude: Iterable[int] = ()) -> tuple[int, int]:
        """(row, n): a row (not in exclude) whose cache holds tokens[:n], n the most whole blocks found; (-1, 0)
        when no row holds even the first block."""
        excluded = set(exclude)

        def lazily():  # hashed block by block: a prompt no row holds costs one block
            h = 0
            for i in range(len(tokens) // BLOCK):
                h = hash((h, tuple(tokens[i * BLOCK:(i + 1) * BLOCK])))
                yield h

        return self._longest(lazily(), lambda row: row not in excluded)

    def match_hashes(self, hashes: Sequence[int], among: Iterable[int]) -> tuple[int, int]:
        """match() for tokens whose chained hashes are known (another row's), among these rows only."""
        allowed = set(among)
        return self._longest(hashes, allowed.__contains__)

    def _longest(self, hashes: Iterable[int], allowed) -> tuple[int, int]:
        def holds(row: int, i: int, h: int) -> bool:
            return allowed(row) and len(self.hashes[row]) > i and self.hashes[row][i] == h

        best = (-1, 0)
        for i, h in enumerate(hashes):
            # the row found so far if it holds this block too (a chained hash stands for every block before it),
            # else any row registered with it that still holds it
            row = best[0]
            if row < 0 or not holds(row, i, h):
                row = next((r for r in self.owners.get(h, ()) if holds(r, i, h)), -1)
                if row < 0:
                    break
            best = (row, (i + 1) * BLOCK)
        return best
