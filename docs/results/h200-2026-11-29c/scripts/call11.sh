mkdir -p .whl && cp .whlmin/*.whl .whl/ && . scripts/gpu/env.sh
$PY -c "import torch, transformers; print(torch.__version__, transformers.__version__, hasattr(transformers,'Lfm3Config'), hasattr(transformers,'GraniteSWAConfig'), torch.cuda.get_device_name())" > $OUT/versions.txt 2>&1
timeout 200 $PY -m pytest -q -p no:cacheprovider tests/test_inference.py -k "blocks_the_fused_block_refuses and (granite-swa or lfm3 or gpt-oss)" > $OUT/pytest_engine.log 2>&1; echo "rc $?" >> $OUT/pytest_engine.log
timeout 120 $PY -m pytest -q -p no:cacheprovider tests/test_moe.py -k "gpu" tests/test_model.py -k "gpu" > $OUT/pytest_moe_model.log 2>&1; echo "rc $?" >> $OUT/pytest_moe_model.log
printf 'the experts share the tokens between them. %.0s' $(seq 1 3000) > /tmp/moe.txt
timeout 150 $PY -m redline train --preset tiny data.path=/tmp/moe.txt model.moe_experts=4 model.moe_top_k=2 model.moe_expert_bias=true model.moe_bias_update=0.01 max_steps=30 eval_every=30 eval_batches=1 batch_size=8 seq_len=128 out_dir=/tmp/moe-runs run_name=balance > $OUT/moe_balance.log 2>&1; echo "rc $?" >> $OUT/moe_balance.log
$PY -c "
from safetensors.torch import load_file; import glob
[w] = glob.glob('/tmp/moe-runs/balance/checkpoints/step_00000030/model.safetensors')
b = {n: t for n, t in load_file(w).items() if n.endswith('mlp.expert_bias')}
print({n: [round(x, 3) for x in t.tolist()] for n, t in b.items()})
" >> $OUT/moe_balance.log 2>&1
