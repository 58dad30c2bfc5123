"""redline's Triton kernels for training: the symmetric products of Muon's Newton–Schulz iteration
(symmetric.py). Each needs the triton package and a CUDA GPU; without them the callers use torch's own ops."""
