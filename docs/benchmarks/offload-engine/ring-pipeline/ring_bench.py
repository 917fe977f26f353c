"""The stream mode's ring pipeline in plain torch (no Megatron): how fast the moments move through a ring of S GPU
slots (H2D, Adam, D2H per chunk, as runtime/streamed_states.py arranges them), and how much of it a forward that
waits per layer for its chunks hides. Issue #16: the 4-layer MoE proxy's stream step costs ~0.6 s more than its
baseline; the copies alone are >= 0.5 s on the link. This asks whether the ring itself runs at the link's rate.

    python ring_bench.py --params 800e6 --layers 4 --layer-ms 100 --slots 3,6 --out results.json
"""
from __future__ import annotations

import argparse
import json
import time

import torch


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--params", type=float, default=800e6, help="offloaded fp32 parameters (moments: 8 B each)")
    p.add_argument("--chunks", type=int, default=32)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--layer-ms", type=float, default=100.0, help="GPU compute per layer of the stand-in forward")
    p.add_argument("--slots", default="3,6")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None)
    return p.parse_args()


class Ring:
    def __init__(self, n: int, chunks: int, slots: int, dev, host, gpu):
        self.n, self.chunks, self.slots = n, chunks, slots
        self.numel = -(-n // chunks)
        self.host_m, self.host_v, self.pin_s = host
        self.params, self.grads = gpu
        self.ring = [torch.empty(2 * self.numel, device=dev) for _ in range(slots)]
        self.h2d, self.upd, self.d2h = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()
        self.slot_free = [None] * slots
        self.step = torch.tensor(1.0, device=dev)

    def bounds(self, i):
        a = i * self.numel
        return a, min(a + self.numel, self.n)

    def fetch(self, i):
        a, b = self.bounds(i)
        s, k = i % self.slots, b - a
        if self.slot_free[s] is not None:
            self.h2d.wait_event(self.slot_free[s])
        with torch.cuda.stream(self.h2d):
            self.ring[s][:k].copy_(self.host_m[a:b], non_blocking=True)
            self.ring[s][self.numel:self.numel + k].copy_(self.host_v[a:b], non_blocking=True)

    def enqueue(self, i, prefetched: bool, copy_down=True, copy_up=True):
        a, b = self.bounds(i)
        s, k = i % self.slots, b - a
        if copy_up and not (prefetched and i < self.slots):
            self.fetch(i)
        self.upd.wait_stream(self.h2d)
        with torch.cuda.stream(self.upd):
            p, g = self.params[a:b], self.grads[a:b]
            m, v = self.ring[s][:k], self.ring[s][self.numel:self.numel + k]
            torch._fused_adamw_([p], [g], [m], [v], [], [self.step], lr=1e-4, beta1=0.9, beta2=0.95,
                                weight_decay=0.1, eps=1e-8, amsgrad=False, maximize=False)
            ready = self.upd.record_event()
        if copy_down:
            self.d2h.wait_event(ready)
            with torch.cuda.stream(self.d2h):
                self.host_m[a:b].copy_(self.ring[s][:k], non_blocking=True)
                self.host_v[a:b].copy_(self.ring[s][self.numel:self.numel + k], non_blocking=True)
            self.slot_free[s] = self.d2h.record_event()
        else:
            self.slot_free[s] = ready
        return ready


def forward_layer(x, w, reps):
    for _ in range(reps):
        x = torch.matmul(x, w)
    return x


def calibrate(dev, ms):
    x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16) * 0.01
    w = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16) * 0.01
    forward_layer(x, w, 3)
    torch.cuda.synchronize()
    t = time.time()
    forward_layer(x, w, 20)
    torch.cuda.synchronize()
    per = (time.time() - t) / 20
    return x, w, max(1, round(ms / 1000 / per)), per


def timed(fn):
    torch.cuda.synchronize()
    t = time.time()
    fn()
    torch.cuda.synchronize()
    return time.time() - t


def main():
    args = parse()
    dev = torch.device("cuda")
    n = int(args.params)
    x, w, reps, per = calibrate(dev, args.layer_ms)
    results = {"params": n, "bytes_each_way": 8 * n, "chunks": args.chunks, "layers": args.layers,
               "gemm_ms": per * 1e3, "gemms_per_layer": reps, "runs": []}
    print(json.dumps({k: v for k, v in results.items() if k != "runs"}), flush=True)
    t0 = time.time()
    host = (torch.empty(n, dtype=torch.float32, pin_memory=True).zero_(),
            torch.empty(n, dtype=torch.float32, pin_memory=True).zero_())
    host = (*host, time.time() - t0)
    gpu = (torch.randn(n, device=dev) * 0.01, torch.randn(n, device=dev) * 0.001)
    for slots in [int(s) for s in args.slots.split(",")]:
        ring = Ring(n, args.chunks, slots, dev, host, gpu)
        per_layer = -(-args.chunks // args.layers)
        cur = torch.cuda.current_stream()

        def copies(prefetched=False, up=True, down=True):
            for i in range(args.chunks):
                ring.enqueue(i, prefetched, copy_down=down, copy_up=up)
            cur.wait_stream(ring.d2h)
            cur.wait_stream(ring.upd)

        def fwd_only():
            y = x
            for _ in range(args.layers):
                y = forward_layer(y, w, reps)

        def fwd_with_update(prefetch_first: bool):
            if prefetch_first:  # the engine fetches the first `slots` chunks at the end of the previous update
                for i in range(slots):
                    ring.fetch(i)
            torch.cuda.synchronize()
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            t = time.time()
            readies = [ring.enqueue(i, prefetch_first) for i in range(args.chunks)]  # enqueued up front
            y = x
            for layer in range(args.layers):
                for i in range(layer * per_layer, min(args.chunks, (layer + 1) * per_layer)):
                    cur.wait_event(readies[i])
                y = forward_layer(y, w, reps)
            end_fwd = torch.cuda.Event(enable_timing=True)
            end_fwd.record()
            cur.wait_stream(ring.d2h)
            torch.cuda.synchronize()
            return time.time() - t, start.elapsed_time(end_fwd) / 1e3

        for r in range(args.repeats + 1):
            row = {"slots": slots, "round": r, "pin_s": ring.pin_s}
            row["copies_both_s"] = timed(lambda: copies())
            row["copies_up_only_s"] = timed(lambda: copies(down=False))
            row["copies_down_only_s"] = timed(lambda: copies(up=False))
            row["forward_only_s"] = timed(fwd_only)
            total, forward_end = fwd_with_update(prefetch_first=True)
            row["forward_with_update_s"] = total  # until the last moments are home
            row["forward_end_s"] = forward_end  # until the stand-in forward ends
            gb = 8 * n / 1e9
            row["up_GBps"] = gb / row["copies_up_only_s"]
            row["down_GBps"] = gb / row["copies_down_only_s"]
            row["both_GBps_each_way"] = gb / row["copies_both_s"]
            if r > 0:  # round 0 warms up
                results["runs"].append(row)
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
        del ring
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
