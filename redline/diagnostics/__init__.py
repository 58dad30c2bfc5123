"""What `redline doctor` measures, one concern per module.

gpu_info     GPU properties, software versions, whether this torch build has kernels for the GPU, NVML
             readings (clocks, power, temperature, throttle reasons) and the host CPU.
precisions   which number formats work: by compute capability, and by running a tiny real op in each.
attention    which SDPA backends run, and their forward+backward time for a typical shape.
microbench   GEMM TFLOP/s, device and host-to-device bandwidth, CPU matmul GFLOP/s (CUDA-event timing).
verdicts     green / yellow / red lines, each yellow or red one with its fix.
"""
