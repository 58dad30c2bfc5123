mkdir -p .whl && cp .whlmin/*.whl .whl/ && . scripts/gpu/env.sh
( nvidia-smi --query-gpu=name --format=csv,noheader; $PY -c "import torch, transformers; print(torch.__version__, transformers.__version__)" ) > $OUT/versions.txt 2>&1
timeout 170 $PY -m pytest -q -x -p no:cacheprovider tests/test_moe.py > $OUT/pytest.log 2>&1
echo "pytest rc $?" >> $OUT/pytest.log
i=0
for extra in "" "model.moe_experts=8 model.moe_top_k=2 model.mlp_hidden=1024 model.moe_aux_loss=0.01"; do
  i=$((i+1))
  timeout 150 $PY -m redline bench --preset modern-124m batch_size=16 seq_len=1024 warmup=5 steps=20 $extra > $OUT/bench$i.log 2>&1
  echo "rc $?" >> $OUT/bench$i.log
done
