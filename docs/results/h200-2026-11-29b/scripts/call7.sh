mkdir -p .whl && cp .whlmin/*.whl .whl/ && . scripts/gpu/env.sh
$PY -c "import torch, transformers; print(torch.__version__, transformers.__version__, hasattr(transformers,'NanoChatConfig'), torch.cuda.get_device_name())" > $OUT/versions.txt 2>&1
timeout 110 $PY -m pytest -q -p no:cacheprovider tests/test_short_conv.py tests/test_moe.py -k gpu > $OUT/pytest_moe_conv.log 2>&1; echo "rc $?" >> $OUT/pytest_moe_conv.log
timeout 80 $PY -m pytest -q -p no:cacheprovider tests/test_inference.py -k "matvec_decode_matches_full_forward and nanochat" > $OUT/pytest_nanochat.log 2>&1; echo "rc $?" >> $OUT/pytest_nanochat.log
mkdir -p $OUT/nanochat $OUT/olmo1b
timeout 190 $PY scripts/gpu/import_bench.py --models nanochat --out $OUT/nanochat > $OUT/nanochat/bench.log 2>&1; echo "rc $?" >> $OUT/nanochat/bench.log
timeout 190 $PY scripts/gpu/import_bench.py --models olmo1b --out $OUT/olmo1b > $OUT/olmo1b/bench.log 2>&1; echo "rc $?" >> $OUT/olmo1b/bench.log
