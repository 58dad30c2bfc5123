# Sourced by the GPU scripts that use the real SmolLM2-135M-Instruct GGUF (import_bench.sh, init_from.sh): sets
# GGUF to GGUF= if given, else .models/SmolLM2-135M-Instruct.Q4_1.gguf, else its pieces .models/NAME.part-*
# joined in name order (a GPU call carries at most 64 MiB, so the file may travel in two calls); empty if none.
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
GGUF="${GGUF:-}"
if [ -z "$GGUF" ] && [ -f ".models/$NAME" ]; then
    GGUF=".models/$NAME"
elif [ -z "$GGUF" ] && ls .models/$NAME.part-* >/dev/null 2>&1; then
    cat .models/$NAME.part-* > "/tmp/$NAME" && GGUF="/tmp/$NAME"
fi
