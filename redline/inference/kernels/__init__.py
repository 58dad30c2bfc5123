"""redline's Triton kernels for the decode step: attention from the qkv projection (decode_attention.py), the
Linear layers with their norms and epilogues fused (linear.py), a pre-norm block and the head built from them
(fused_block.py), and programmatic dependent launch (launch.py). Importing a kernel module registers its
torch.ops.redline operators; each needs the triton package and a CUDA GPU to run."""
