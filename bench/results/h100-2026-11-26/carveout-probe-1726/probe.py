# Does an SM carve-out (cuBLASLt SM_COUNT_TARGET) let a conversion on a second stream overlap
# a cuBLAS bf16 GEMM on the H100? Each variant is a CUDA graph; times per call in microseconds.
import torch
torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
dev = 'cuda'
carve = getattr(torch._C, '_set_sm_carveout_experimental', None)
print("torch", torch.__version__, "carveout api:", carve is not None, flush=True)
def timeit(fn, iters=100):
    for _ in range(5): fn()
    torch.cuda.synchronize()
    s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
    res = []
    for _ in range(5):
        s.record()
        for _ in range(iters): fn()
        e.record(); torch.cuda.synchronize()
        res.append(s.elapsed_time(e) / iters * 1e3)
    return sorted(res)[2]
def graphed(fn):
    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        for _ in range(3): fn()
    torch.cuda.current_stream().wait_stream(st)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay
for (M, N, K, name) in [(16384, 2304, 768, '124m.qkv fprop'), (16384, 768, 2304, '124m.qkv dgrad'),
                        (16384, 768, 768, '124m.proj fprop'), (16384, 768, 2048, '124m.fc2 fprop'),
                        (16384, 768, 32000, '124m.head dgrad')]:
    A = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    B = torch.randn(K, N, device=dev, dtype=torch.bfloat16)
    codes = torch.randint(0, 255, (M, K), device=dev, dtype=torch.uint8)
    out = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
    side = torch.cuda.Stream(priority=-1)
    def deq(rows=slice(None)):
        return codes[rows].to(torch.bfloat16)
    def gemm():
        torch.matmul(A, B, out=out)
    def piped_fn(S):
        bufs = [None] * S
        evs = [torch.cuda.Event() for _ in range(S)]
        def piped():
            main = torch.cuda.current_stream()
            ch = M // S
            bufs[0] = deq(slice(0, ch))
            start = torch.cuda.Event(); start.record(main)
            side.wait_event(start)
            with torch.cuda.stream(side):
                for i in range(1, S):
                    bufs[i] = deq(slice(i * ch, (i + 1) * ch)); evs[i].record(side)
            for i in range(S):
                if i > 0: main.wait_event(evs[i])
                torch.matmul(bufs[i], B, out=out[i * ch:(i + 1) * ch])
            main.wait_stream(side)
        return piped
    if carve: carve(0)
    t_deq = timeit(graphed(lambda: deq()))
    t_ser = timeit(graphed(lambda: (deq(), gemm())))
    line = f"{name:16s} deq {t_deq:7.1f} serial {t_ser:7.1f} |"
    base = None
    for c in ([0, 8, 16, 24, 32] if carve else [0]):
        if carve: carve(c)
        tg = timeit(graphed(gemm))
        if base is None: base = tg
        tp4 = timeit(graphed(piped_fn(4)))
        tp8 = timeit(graphed(piped_fn(8)))
        line += f" c{c}: gemm {tg:7.1f} p4 {tp4:7.1f} ({base/tp4:.2f}) p8 {tp8:7.1f} ({base/tp8:.2f}) |"
    if carve: carve(0)
    print(line, flush=True)
    del A, B, codes, out
