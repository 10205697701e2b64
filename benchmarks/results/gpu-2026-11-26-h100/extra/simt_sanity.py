import sys, cupy, numpy, torch
cupy.cuda.set_allocator(None)
import cupyconv
from cupyconv import conv2d, conv2d_backward
rng = numpy.random.default_rng(1)
worst = 0.0
for (N, C, K, H, W, k, s, p) in [(2, 64, 64, 14, 14, 3, 1, 1), (3, 24, 40, 9, 13, 3, 2, 1), (1, 17, 33, 7, 11, 5, 1, 2),
                                 (2, 128, 64, 28, 28, 1, 1, 0), (2, 8, 16, 5, 5, 3, 1, 1)]:
    x = rng.standard_normal((N, C, H, W)).astype(numpy.float32); w = rng.standard_normal((K, C, k, k)).astype(numpy.float32)
    y = conv2d(cupy.asarray(x), cupy.asarray(w), None, s, p, algorithm="implicit_gemm")
    ref = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), None, s, p).numpy()
    e = float(numpy.linalg.norm(cupy.asnumpy(y) - ref) / numpy.linalg.norm(ref)); worst = max(worst, e)
    g = rng.standard_normal(ref.shape).astype(numpy.float32)
    gr = conv2d_backward(cupy.asarray(g), cupy.asarray(x), cupy.asarray(w), stride=s, padding=p, algorithm="implicit_gemm")
    xt = torch.from_numpy(x).double().requires_grad_(); wt = torch.from_numpy(w).double().requires_grad_()
    torch.nn.functional.conv2d(xt, wt, None, s, p).backward(torch.from_numpy(g).double())
    for a, b in ((gr[0], xt.grad), (gr[1], wt.grad)):
        e = float(numpy.linalg.norm(cupy.asnumpy(a) - b.numpy()) / numpy.linalg.norm(b.numpy())); worst = max(worst, e)
cupy.cuda.Device().synchronize()
print("simt fp32 worst rel err", worst); sys.exit(0 if worst < 1e-5 else 1)
