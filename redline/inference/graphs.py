"""CUDA graphs of the decode step: one per (attended width, greedy), captured once and replayed.

A decode step is dozens of small kernels; replaying them as one graph removes the host's launch cost. Each graph
reads and writes only the engine's static tensors (the step's input tokens, slots, history, the cache), so a
replay after the host has updated them in place runs the next step. The graphs of one StepGraphs share one memory
pool, so they must never run at the same time (a state's prefill graphs have a StepGraphs of their own: a server
runs them on another stream beside the decode steps). Muon's Newton–Schulz runs (training/muon.py) are replayed
the same way, one graph a stack of same-shape matrices.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class StepGraphs:
    def __init__(self, device: torch.device):
        self.device = device
        self.graphs: dict = {}  # key -> (CUDAGraph, its outputs)
        self.pool = None

    def __contains__(self, key) -> bool:
        return key in self.graphs

    def capture(self, key, step: Callable[[], object], warm: Callable[[], None],
                capture_error_mode: str = "global") -> None:
        """Warm up (compiling on the first call) on a side stream with `warm` (a run of the step that changes
        nothing), then record `step` in a graph under `key` (capturing runs nothing, so it changes nothing either).
        capture_error_mode "thread_local" lets other threads (the collectives' watchdog under DDP) query events
        while this one records."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                warm()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode=capture_error_mode):
            outputs = step()
        self.graphs[key] = (graph, outputs)

    def replay(self, key):
        graph, outputs = self.graphs[key]
        graph.replay()
        return outputs
