"""The runtime layer: how a model's passes run on this machine, beside the PyTorch model definitions in models/.

config.py   RuntimeConfig: device, dtype, the weights' and activations' formats, the native paths, compile
prepare.py  prepare(module, config): the steps that turn a loaded module into the one that runs, in one order
quant.py, gguf_quant.py, wide_linear.py
            the quantized and kernel-backed linear layers (int8 / int4, a GGUF file's blocks, bf16 wide passes)
lean_step.py, lean_drafters.py
            a pass of a few tokens in one native call (kernels/lean_decode.cpp), for targets (LeanTransformer: the
            PyTorch model with that fast path, same forward / forward_packed) and drafter modules
packed.py   several requests' passes in one forward (continuous batching)

Nothing here imports models/ but what it extends or checks: transformer.py (LeanTransformer, packed.py),
norms.py, gguf_meta.py. models/transformer.py imports nothing of the runtime's.
"""
