# Sourced by the GPU scripts that use the real SmolLM2-135M-Instruct GGUF (import_bench.sh, init_from.sh): sets
# GGUF to GGUF= if given, else .models/SmolLM2-135M-Instruct.Q4_1.gguf, else its pieces NAME.part-* joined in name
# order; empty if none. A GPU call carries at most 64 MiB, so the file travels in two calls, and a call's carry
# replaces the ignored folder it names: the first call copies its piece out of the repository, e.g.
#     call 1 (carry .models/NAME.part-aa):  mkdir -p /tmp/gguf-parts && cp .models/NAME.part-aa /tmp/gguf-parts/
#     call 2 (carry .models/NAME.part-ab):  scripts/gpu/import_bench.sh
# and the pieces are looked for in .models/ and /tmp/gguf-parts/.
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
GGUF="${GGUF:-}"
if [ -z "$GGUF" ] && [ -f ".models/$NAME" ]; then
    GGUF=".models/$NAME"
elif [ -z "$GGUF" ] && ls .models/$NAME.part-* /tmp/gguf-parts/$NAME.part-* >/dev/null 2>&1; then
    PIECES=$(for p in .models/$NAME.part-* /tmp/gguf-parts/$NAME.part-*; do [ -f "$p" ] && echo "$(basename "$p") $p"; done \
        | sort -u -k1,1 | cut -d' ' -f2)
    cat $PIECES > "/tmp/$NAME" && GGUF="/tmp/$NAME"
fi
