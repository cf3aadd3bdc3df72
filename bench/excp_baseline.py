"""ExCP (Li et al., ICML 2024), reimplemented from its published recipe (github Gaffey/ExCP,
compress_pythia.py) as the whole-training-state baseline of bench/resume_eval.py.

Per version t and parameter W with Adam moments m (exp_avg) and v (exp_avg_sq):
  1. residual dW = W_t - R_{t-1} against the previous *reconstruction* (closed loop);
  2. weight mask: keep dW_i iff |dW_i| > median(|dW|) * min(2.5, alpha / sqrt(mean(v)));
  3. momentum mask: keep m_i iff |m_i| > beta * mean(|m|) and dW_i was kept; v uses the same mask;
  4. each of dW, m, v: 1-D k-means with 2^bits - 1 centroids on the kept values, index 0 for
     zero, indices packed 8/bits per byte, an fp16 codebook;
  5. a lossless pass over the version's bytes (7-Zip in the paper; LZMA, its algorithm, here).
Restore: R_t = R_{t-1} + dequant(dW); m, v are the dequantized pruned tensors.
The first version has no previous reconstruction: its weights are stored losslessly (LZMA), as
the LC-Checkpoint baseline of bench/lossy_eval.py does; its moments follow steps 3-5 with every
weight kept. Tensors that are not a parameter with both moments (the step counter) are stored
losslessly.
"""
import lzma

import numpy as np


def kmeans_1d(values, clusters, iterations=25):
    """Lloyd's algorithm on a line: centroids (sorted) and each value's index into them."""
    if values.size == 0:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    centroids = np.unique(np.quantile(values, (np.arange(clusters) + 0.5) / clusters))
    for _ in range(iterations):
        edges = (centroids[1:] + centroids[:-1]) / 2
        index = np.searchsorted(edges, values)
        counts = np.bincount(index, minlength=centroids.size)
        sums = np.bincount(index, weights=values, minlength=centroids.size)
        moved = np.where(counts > 0, sums / np.maximum(counts, 1), centroids)
        if np.allclose(moved, centroids):
            break
        centroids = np.sort(moved)
    edges = (centroids[1:] + centroids[:-1]) / 2
    return centroids, np.searchsorted(edges, values)


def quantize(x, keep, bits):
    """The pruned tensor as packed indices + fp16 codebook (bytes) and its dequantized values."""
    clusters = 2 ** bits - 1
    centroids, index = kmeans_1d(x[keep].astype(np.float64), clusters)
    codebook = centroids.astype(np.float16)
    symbols = np.zeros(x.size, dtype=np.uint8)
    symbols[keep] = index.astype(np.uint8) + 1
    out = np.zeros(x.size, dtype=np.float32)
    out[keep] = codebook.astype(np.float32)[index]
    per_byte = 8 // bits
    padded = np.zeros(-(-x.size // per_byte) * per_byte, dtype=np.uint8)
    padded[:x.size] = symbols
    packed = np.zeros(padded.size // per_byte, dtype=np.uint8)
    for k in range(per_byte):
        packed |= padded[k::per_byte] << (bits * k)
    return packed.tobytes() + codebook.tobytes(), out


class ExcpCoder:
    """Codes a run's versions in order. code(tensors) takes one version (name -> float32/int
    numpy array; parameters as `model.<p>` with `optim.<p>.exp_avg` / `optim.<p>.exp_avg_sq`)
    and returns (stored bytes of the version's weights, moments and other tensors, each
    compressed apart; its reconstruction)."""

    def __init__(self, alpha=5e-5, beta=2.0, bits=4):
        self.alpha, self.beta, self.bits = alpha, beta, bits
        self.reference = {}

    def code(self, tensors):
        blobs = {"weights": bytearray(), "moments": bytearray(), "other": bytearray()}
        out = dict(tensors)
        coded = set()
        for name, w in tensors.items():
            if not name.startswith("model."):
                continue
            p = name[len("model."):]
            m = tensors.get(f"optim.{p}.exp_avg")
            v = tensors.get(f"optim.{p}.exp_avg_sq")
            if m is None or v is None or w.dtype != np.float32:
                continue
            coded.update((name, f"optim.{p}.exp_avg", f"optim.{p}.exp_avg_sq"))
            reference = self.reference.get(name)
            if reference is None:
                blobs["weights"] += w.tobytes()  # the first version: lossless weights
                weight_kept = np.ones(w.size, dtype=bool)
                recon = w.copy()
            else:
                residual = w.astype(np.float64) - reference
                scale = min(2.5, self.alpha / max(np.sqrt(np.mean(v, dtype=np.float64)), 1e-30))
                weight_kept = np.abs(residual) > np.median(np.abs(residual)) * scale
                data, dq = quantize(residual, weight_kept, self.bits)
                blobs["weights"] += data
                recon = (reference + dq).astype(np.float32)
            self.reference[name] = recon.astype(np.float64)
            out[name] = recon
            moment_kept = (np.abs(m) > self.beta * np.mean(np.abs(m))) & weight_kept
            for key, moment in ((f"optim.{p}.exp_avg", m), (f"optim.{p}.exp_avg_sq", v)):
                data, dq = quantize(moment, moment_kept, self.bits)
                blobs["moments"] += data
                out[key] = dq
        for name, t in tensors.items():  # what is not a parameter with moments: lossless
            if name not in coded:
                blobs["other"] += t.tobytes()
        sizes = {k: len(lzma.compress(bytes(b), preset=9)) for k, b in blobs.items()}
        return sizes, out
