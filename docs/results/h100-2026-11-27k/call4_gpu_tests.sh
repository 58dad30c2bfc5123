# the compiled FP8 head's GPU test (failed in t1), then the GPU tests t1 did not reach
. scripts/gpu/env.sh
D=$OUT
timeout 200 $PY -m pytest -q -x -m gpu -p no:cacheprovider tests/test_float8_head.py > $D/fp8_head.txt 2>&1
grep -v "^  warn\|Warning" $D/fp8_head.txt | tail -n 60 | cut -c1-400
timeout 330 $PY -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_serve.py tests/test_serve_engine_process_gpu.py tests/test_serve_logprobs.py tests/test_sft.py tests/test_step.py -k "not test_greedy_tokens_among_others_equal_alone_on_a_gpu" > $D/gpu_tests_tail.txt 2>&1
tail -n 15 $D/gpu_tests_tail.txt | cut -c1-300
