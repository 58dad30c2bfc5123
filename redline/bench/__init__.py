"""`redline bench`: time the training step of any preset or config on this machine.

step.py    builds one training step from a TrainConfig, exactly as the training loop runs it, and times it
matrix.py  runs a matrix of points, each in its own process (an out-of-memory point is reported, the rest go on)
profile.py records a PyTorch profiler trace and groups kernel time (GEMM, attention, norm, optimizer, other)
scaling.py multi-GPU scaling (`--gpus 1,2,4`): each world size under torchrun in its own processes, tokens/s,
           efficiency, and the communication share of the step from the profiler
"""
