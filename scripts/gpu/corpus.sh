# Sourced by the GPU scripts that train on a corpus: prepare_corpus CORPUS OUT_DIR sets DATA to a prepared shard
# folder. CORPUS is one already (`redline data prepare`), used as it is, or raw text: *.jsonl[.xz|.gz] / *.txt /
# *.parquet files (or one such file), those named val* becoming the validation split (else 2% of the documents),
# prepared into OUT_DIR/corpus with a VOCAB-token byte-level BPE (default 32768) trained on its first
# TOKENIZER_BYTES bytes (default 25 MB); the log goes to OUT_DIR/prepare.log. Needs PY (scripts/gpu/env.sh).
# corpus_argument USAGE VALUE sets CORPUS to VALUE, or prints the script's usage and exits 2 when VALUE names no file
# or folder.
corpus_argument() {
    CORPUS="$2"
    if [ -z "$CORPUS" ] || [ ! -e "$CORPUS" ]; then
        echo "usage: $1   (prepared shards or raw .jsonl.xz files; got '${CORPUS}')" >&2
        exit 2
    fi
}
prepare_corpus() {
    local corpus="$1" out="$2" vocab="${VOCAB:-32768}" tokenizer_bytes="${TOKENIZER_BYTES:-25000000}"
    if "$PY" -c 'import sys; from redline.data.prepare import is_prepared; sys.exit(not is_prepared(sys.argv[1]))' "$corpus"; then
        DATA="$corpus"
        return 0
    fi
    DATA="$out/corpus"
    local all=() train=() val=() split=(--val-fraction 0.02) f
    shopt -s nullglob
    if [ -d "$corpus" ]; then
        all=("$corpus"/*.jsonl "$corpus"/*.jsonl.xz "$corpus"/*.jsonl.gz "$corpus"/*.txt "$corpus"/*.parquet)
    else
        all=("$corpus")
    fi
    for f in "${all[@]}"; do
        case "$(basename "$f")" in val*) val+=("$f") ;; *) train+=("$f") ;; esac
    done
    if [ ${#train[@]} -eq 0 ]; then
        echo "no .jsonl[.xz|.gz], .txt or .parquet files for training in $corpus" >&2
        return 2
    fi
    [ ${#val[@]} -gt 0 ] && split=(--val-inputs "${val[@]}")
    echo "preparing ${#train[@]} training file(s) and ${#val[@]} validation file(s) with a $vocab-token BPE into $DATA"
    if ! "$PY" -m redline data prepare --inputs "${train[@]}" "${split[@]}" --out "$DATA" --tokenizer bpe \
            --vocab-size "$vocab" --tokenizer-train-bytes "$tokenizer_bytes" --overwrite > "$out/prepare.log" 2>&1; then
        tail -n 20 "$out/prepare.log" >&2
        return 1
    fi
    grep -v '^{' "$out/prepare.log" | tail -n 8
}
