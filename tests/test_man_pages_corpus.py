"""scripts/man_pages_corpus.py: roff pages (man and mdoc macros) reduced to their text, links and copies skipped."""
import gzip
import importlib.util
import json
import lzma
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "man_pages_corpus.py"
spec = importlib.util.spec_from_file_location("man_pages_corpus", SCRIPT)
mpc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mpc)

MAN = r""".\" a comment
.TH FROB 1
.SH NAME
frob \- turn knobs
.SH DESCRIPTION
.B frob
turns every knob \(em slowly.
Use
.BR twiddle (1)
for \fIone\fP knob.
.PP
.nf
frob \-a
  frob \-b
.fi
"""

MDOC = r""".Dd May 1, 2025
.Dt TWIDDLE 1
.Sh NAME
.Nm twiddle
.Nd twiddle a knob
.Sh SYNOPSIS
.Nm
.Op Fl v
.Ar knob
"""


def test_man_macros_and_escapes():
    assert mpc.page_text(MAN) == ("NAME\n\nfrob - turn knobs\n\nDESCRIPTION\n\nfrob turns every knob — slowly. Use "
                                  "twiddle(1) for one knob.\n\nfrob -a\n  frob -b")


def test_mdoc_names_and_flags():
    assert mpc.page_text(MDOC) == "NAME\n\ntwiddle - twiddle a knob\n\nSYNOPSIS\n\ntwiddle -v knob"


def test_corpus_skips_links_and_copies(tmp_path):
    man1 = tmp_path / "man" / "man1"
    man1.mkdir(parents=True)
    body = MAN + "More words so that the page is long enough to keep. " * 5 + "\n"
    for name, text in (("frob.1.gz", body), ("frob-copy.1.gz", body), ("link.1.gz", ".so man1/frob.1\n")):
        with gzip.open(man1 / name, "wt") as f:
            f.write(text)
    out = tmp_path / "out"
    subprocess.run([sys.executable, str(SCRIPT), "--man", str(tmp_path / "man"), "--out", str(out)], check=True,
                   capture_output=True)
    docs = [json.loads(line)["text"] for line in lzma.open(out / "train-000.jsonl.xz", "rt")]
    assert len(docs) == 1 and docs[0].startswith("NAME\n\nfrob - turn knobs")
