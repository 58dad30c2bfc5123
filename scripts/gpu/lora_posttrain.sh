#!/usr/bin/env bash
# LoRA and QLoRA through redline sft, dpo and grpo on one GPU (bf16, compiled step; GRPO's engine on the adapted
# training model, whose frozen weights are bf16 or NF4 and adapters fp32). A checkpoint of modern-124m (1 step),
# one step of full SFT to give it redline's chat tokens, then for lora.quantize in none, nf4: 3 steps each of
# redline sft, dpo and grpo with lora.enabled=True. About 5-8 minutes, most of it torch.compile.
# Prints, per command, its last step line and its "done" line (or the error); ends with "lora_posttrain: ok" when
# every run exited 0, else "lora_posttrain: FAILED <runs>". Runs go to $OUT/runs (OUT defaults to a temporary folder).
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/gpu/env.sh
export PYTHONUNBUFFERED=1
OUT=${OUT:-$(mktemp -d)}
R="$OUT/runs"
mkdir -p "$R"
failed=()
run() {  # name, then the redline arguments
    local name=$1; shift
    timeout 240 "$PY" -m redline "$@" eval_every=0 eval_batches=1 log_every=1 tensorboard=False out_dir="$R" \
        run_name="$name" > "$R/$name.log" 2>&1 || failed+=("$name")
    echo "== $name"; grep -E "^step|^done|error" "$R/$name.log" | tail -n 3
}
run base train --preset modern-124m max_steps=1 batch_size=4 seq_len=256 sample_tokens=0
run chat sft --from "$R/base" --data task:arithmetic max_steps=1 batch_size=8 seq_len=256
for q in none nf4; do
    run "sft-$q" sft --from "$R/chat" --data task:arithmetic max_steps=3 batch_size=8 seq_len=256 \
        lora.enabled=True lora.quantize=$q
    run "dpo-$q" dpo --from "$R/chat" --data task:arithmetic dpo.max_pairs=64 max_steps=3 batch_size=8 \
        lora.enabled=True lora.quantize=$q
    run "grpo-$q" grpo --from "$R/chat" --task arithmetic max_steps=3 batch_size=32 grpo.prompts_per_step=4 \
        grpo.group_size=8 grpo.max_new_tokens=16 grpo.eval_examples=32 grpo.kl_coef=0.05 \
        lora.enabled=True lora.quantize=$q
done
"$PY" -m redline generate --checkpoint "$R/sft-nf4" --chat --prompt "What is 2+3?" --max-new-tokens 8 \
    --temperature 0 > "$R/generate.log" 2>&1 || failed+=("generate")
echo "== generate --chat (QLoRA sft, merged on load)"; tail -n 2 "$R/generate.log"
if [ ${#failed[@]} -eq 0 ]; then echo "lora_posttrain: ok"; else echo "lora_posttrain: FAILED ${failed[*]}"; exit 1; fi
