"""Build a second English corpus, from the system's manual pages, to check that a measured recipe's advantage
holds on text it was never tuned on (the shared corpus is Linux kernel docs, Python docs, WordNet and GCIDE).

    python scripts/man_pages_corpus.py --out .corpus/man          # /usr/share/man, sections 1-8, English only

Each page's roff source is reduced to its text: comment and formatting-request lines dropped, the words of the
font macros (.B, .I, .BR, ...) and section headings kept, inline escapes (\\fB, \\(em, \\-, ...) resolved or
removed. Pages that are only a `.so` link to another page, and copies of a page, are skipped. One page is one JSONL
document {"text": ...}; the files are written xz-compressed as train-NNN.jsonl.xz (the speedrun's raw-text preparation
holds out its own validation documents by hash, so no val file is written).
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import lzma
import re
from pathlib import Path

SECTIONS = ("man1", "man2", "man3", "man4", "man5", "man6", "man7", "man8")
# font and heading macros whose arguments are text; everything else starting with '.' is formatting
TEXT_MACROS = {"SH", "SS", "B", "I", "BR", "RB", "IR", "RI", "BI", "IB", "SM", "SB", "IP", "TP", "Nm", "Nd",
               "Sh", "Ss", "Pp", "Xr", "Fl", "Ar", "Op", "Em", "Dq", "Qq", "Sq", "Pa", "Cm", "Ql", "It"}
NAMED = {"em": "—", "en": "–", "aq": "'", "dq": '"', "lq": '"', "rq": '"', "oq": "'", "cq": "'", "bu": "•",
         "co": "©", "rg": "®", "tm": "™", "mu": "×", "<=": "≤", ">=": "≥", "->": "→", "<-": "←", "hy": "-",
         "ti": "~", "ha": "^", "rs": "\\", "ga": "`", "de": "°", "pl": "+", "mi": "-", "eq": "="}
ESCAPE = re.compile(r"\\(f\[[^\]]*\]|f\(..|f.|\(..|\[[^\]]*\]|\*\(..|\*\[[^\]]*\]|\*.|s[+-]?\d+|s\(\d\d|"
                    r"[-e&|^c0~ %:`'])")


def _escape(match: re.Match) -> str:
    code = match.group(1)
    if code.startswith(("f", "s", "*")) or code in ("&", "|", "^", "c", "%", ":"):
        return ""
    if code.startswith("("):
        return NAMED.get(code[1:], "")
    if code.startswith("["):
        return NAMED.get(code[1:-1], "")
    return {"-": "-", "e": "\\", "0": " ", "~": " ", " ": " ", "`": "`", "'": "'"}.get(code, "")


MDOC_INLINE = {"Fl", "Ar", "Op", "Oo", "Oc", "Xr", "Pa", "Cm", "Ic", "Ql", "Dq", "Qq", "Sq", "Em", "Sy", "Li",
               "Ns", "No", "Va", "Ev", "Dv", "Er", "Fn", "Fa", "Ft", "Cd", "Ek", "Ao", "Ac", "Bq", "Brq", "Pq",
               "Aq", "Nm", "Lk", "Mt", "Tn", "Ux", "At", "Bx", "Ox", "Fx", "Nx", "St", "Lb", "In", "Vt", "Ms"}
NOFILL_START = {"nf", "EX", "Bd", "Vb"}
NOFILL_END = {"fi", "EE", "Ed", "Ve"}


def _mdoc_words(words: list[str], name: str) -> str:
    """mdoc's nested macro names resolved: Fl x -> -x, Nm -> the page's name, the others dropped."""
    out, flag = [], False
    for i, w in enumerate(words):
        if w in MDOC_INLINE:
            if w == "Nm" and (i + 1 == len(words) or words[i + 1] in MDOC_INLINE):  # .Nm alone: the page's name
                out.append(name)
            flag = w == "Fl"
            continue
        out.append("-" + w if flag else w)
        flag = False
    return " ".join(out)


def page_text(source: str) -> str:
    """The page's words: paragraphs joined into lines (no-fill blocks kept as they are), markup removed."""
    paragraphs: list[str] = []
    para: list[str] = []
    nofill = False
    first = re.search(r"^\.Nm\s+(\S+)", source, re.M)
    name = first.group(1) if first else ""

    def flush() -> None:
        if para:
            paragraphs.append(("\n" if nofill else " ").join(para).strip())
            para.clear()

    for line in source.splitlines():
        if line.startswith((".\\\"", "'\\\"", "\\\"")) or line.strip() in (".", "'"):
            continue
        if line.startswith((".", "'")):
            parts = line[1:].strip().split(None, 1)
            macro = parts[0] if parts else ""
            if macro in NOFILL_START or macro in NOFILL_END:
                flush()
                nofill = macro in NOFILL_START
                continue
            if macro in ("SH", "SS", "Sh", "Ss", "PP", "Pp", "LP", "P", "sp", "br", "IP", "TP", "It"):
                flush()
            if macro not in TEXT_MACROS and macro not in MDOC_INLINE or len(parts) == 1 and macro != "Nm":
                continue
            words = [w.strip('"') for w in re.findall(r'"[^"]*"|[^\s"]+', parts[1] if len(parts) > 1 else "")]
            if macro in MDOC_INLINE:
                line = _mdoc_words([macro] + words, name)
            elif macro[1:2].islower():  # mdoc block macros (.Sh, .Nd, .It): their arguments may nest inline ones
                line = ("- " if macro == "Nd" else "") + _mdoc_words(words, name)
            else:
                line = ("" if macro in ("BR", "RB", "IR", "RI", "BI", "IB") else " ").join(words)
            if macro in ("SH", "SS", "Sh", "Ss"):
                para.append(line)
                flush()
                continue
        text = ESCAPE.sub(_escape, line).rstrip()
        if not text.strip() and not nofill:
            flush()
        elif text.strip():
            para.append(text if nofill else text.strip())
    flush()
    return "\n\n".join(p for p in paragraphs if p)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--man", default="/usr/share/man", help="the manual's root folder (English pages only)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--shard-mb", type=float, default=25.0, help="text per output file")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pages = sorted(p for s in SECTIONS for p in (Path(args.man) / s).glob("*.gz") if p.is_file())
    shard, size, written, total = 0, 0, 0, 0
    seen: set[bytes] = set()  # links and copies of one page (symlinked names, identical sections) kept once
    f = lzma.open(out / f"train-{shard:03d}.jsonl.xz", "wt", encoding="utf-8")
    for page in pages:
        try:
            source = gzip.open(page, "rt", encoding="utf-8", errors="replace").read()
        except (OSError, EOFError):
            continue
        if source.lstrip().startswith(".so "):
            continue
        text = page_text(source)
        digest = hashlib.blake2b(text.encode(), digest_size=16).digest()
        if len(text) < 200 or digest in seen:
            continue
        seen.add(digest)
        f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
        n = len(text.encode())
        size, total, written = size + n, total + n, written + 1
        if size >= args.shard_mb * 1e6:
            f.close()
            shard, size = shard + 1, 0
            f = lzma.open(out / f"train-{shard:03d}.jsonl.xz", "wt", encoding="utf-8")
    f.close()
    print(f"{written:,} pages, {total / 1e6:.1f} MB of text, in {shard + 1} files under {out}")


if __name__ == "__main__":
    main()
