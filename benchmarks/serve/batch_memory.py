"""RSS of the batching engine under server-like load, in-process (no HTTP): MAXB requests active, a new one
admitted as each leaves, a LEAVE share cancelled after 1-8 chunks; RSS (and after malloc_trim) every 40 requests,
then the live torch tensors. Environment: N, MAXB (16), LEAVE (0.1), DRAFTER (prompt-lookup), MMAP (fixed glibc
mmap threshold in bytes), NOSDPA=1 (explicit-matmul attention everywhere), PREFIX (MiB of prefix cache, 0: none),
QUANT (e.g. gguf-q8: float32 activations over the GGUF file's blocks). A diagnostic for the memory growth in docs/serving.md, not a test.

    OMP_NUM_THREADS=1 N=120 .venv/bin/python benchmarks/serve/batch_memory.py
"""
import ctypes, os, random, re, time
import torch
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "64")
from foretell.api import load
import foretell.models.transformer as _tr
if os.environ.get("NOSDPA"): _tr.SMALL_STEP = 10**9
from foretell.bench.datasets import load_prompts
from foretell.types import SamplingParams

libc = ctypes.CDLL("libc.so.6")
if os.environ.get("MMAP"):
    print("mallopt", libc.mallopt(-3, int(os.environ["MMAP"])))  # M_MMAP_THRESHOLD fixed: no dynamic growth
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = MallInfo2
def heap():
    """glibc's view: bytes in use from the heap, in mmapped chunks, and free in the heap (MiB)."""
    m = libc.mallinfo2()
    return f"in use {m.uordblks / 2**20:.0f} + mmapped {m.hblkhd / 2**20:.0f}, free {m.fordblks / 2**20:.0f}"
def rss():
    return int(re.search(r"VmRSS:\s+(\d+)", open("/proc/self/status").read()).group(1)) / 1024
torch.set_num_threads(1)
quant = os.environ.get("QUANT", "none")
pipe = load("smollm2-135m", os.environ.get("DRAFTER", "prompt-lookup"), dtype="float32" if quant.endswith("q8") else "bfloat16",
            quant=quant)
allp = [pipe.encode(p["prompt"]) for p in load_prompts(["spec-bench"], 5)]
from foretell.prefix_cache import PrefixCache
prefixes = PrefixCache.of_megabytes(int(os.environ.get("PREFIX", 0)))
batch = pipe.batch_engine(max_batch=int(os.environ.get("MAXB", 16)), prefix_cache=prefixes)
params = SamplingParams(max_new_tokens=32)
rng = random.Random(0)
done = 0
live = []
def submit():
    state = {"chunks": 0, "leave": rng.random() < float(os.environ.get("LEAVE", 0.1)), "after": rng.randint(1, 8)}
    def on_chunk(c, s=state):
        global done
        s["chunks"] += 1
        if c.result is not None:
            done += 1
        elif s["leave"] and s["chunks"] >= s["after"]:
            s["req"].cancel(); done += 1
    state["req"] = batch.submit(rng.choice(allp), params, on_chunk, lambda e: print("ERR", e))
t = time.time(); print("start", round(rss()), flush=True)
total = int(os.environ.get("N", 320)); sent = 0; mark = 40
while done < total:
    while sent < total and sent - done < int(os.environ.get("MAXB", 16)):
        submit(); sent += 1
    batch.step()
    if done >= mark:
        a = rss()
        if os.environ.get("GC"): import gc; gc.collect()  # reference cycles holding KV caches?
        libc.malloc_trim(0)
        import sys, gc; print(f"{done}: rss {a:.0f}, trimmed {rss():.0f}, {time.time()-t:.0f}s ({heap()}) blocks {sys.getallocatedblocks()} objs {len(gc.get_objects())}"
              + (f" prefixes {len(prefixes.entries)} {prefixes.nbytes / 2**20:.0f} MiB" if prefixes else ""), flush=True); mark += 40
import gc, collections
gc.collect()
ts = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
print("tensors", len(ts), "MiB", sum(t.numel() * t.element_size() for t in ts if not t.is_meta) / 2**20)
big = collections.Counter((tuple(t.shape), str(t.dtype)) for t in ts if t.numel() > 100000)
print(big.most_common(8))
cnt = collections.Counter(type(o).__name__ for o in gc.get_objects())
print(cnt.most_common(25))
print("active", len(batch.active), "waiting", len(batch.waiting))
