"""torch.compile debugging for custom accelerators: constraints, AOT capture, guards, KernelDiff, minifier."""
