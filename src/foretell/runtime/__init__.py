"""The runtime layer: how a prepared model's passes run on this machine (native kernels, batching), beside the pure
PyTorch model definitions in models/."""
