"""A machine's measured peaks, and the kernels both the trainer's work counts and the probe name.

Kernels, each `(op, dtype, shape)`; a product's shape is `[M, K, N]` (an `[M, K]` by `[K, N]` product):
`linear` (`x @ W.T + b`, a layer's forward), `mm` (`a @ b`, a layer's input gradient), `mm_tn` (`a.T @ b`, its
weight gradient), `conv` (`[B, C, H, W, O, kernel, stride]`) and `conv_backward` (the same and 1 when the input's
gradient is needed). FLOPs count two per multiply-add, biases left out, as FlopCounterMode does. No torch here.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the trainer imports this module for its FLOP counts: pandas would cost it 0.3 s at start-up
    import pandas as pd

PRODUCTS = ("linear", "mm", "mm_tn")
CONVOLUTIONS = ("conv", "conv_backward")
KERNELS = PRODUCTS + CONVOLUTIONS
# The roof: the fastest square product of the sizes ROOF_SIDES tried (a size is tried only while one call of
# it promises to take at most ROOF_CALL_S, so a dtype the device computes slowly costs no minutes).
ROOF = "roof"
ROOF_SIDES = {"cpu": (256, 512, 1024, 2048), "cuda": (1024, 2048, 4096, 8192)}
ROOF_CALL_S = 0.1
# Bytes moved per second: `memory` counts reads and writes of a large copy (the roofline's bandwidth), the
# host<->device ones the bytes copied. On a CPU there is no device: its copies are memory to memory.
MEMORY = "memory"
COPIES = ("h2d_pinned", "h2d_pageable", "d2h_pinned", "d2h_pageable")
DISPATCH = "dispatch"  # tiny ops per second: the fixed cost of one op (a dispatch on a CPU, a launch on a GPU)
UNITS = {**{op: "FLOP/s" for op in (*KERNELS, ROOF)}, MEMORY: "B/s", **{op: "B/s" for op in COPIES}, DISPATCH: "op/s"}
# Over 100% of a measured ceiling can only mean wrong counts or wrong peaks; a little timing jitter is not
# allowed for: the ceilings are the fastest of repeated timings of work that the phase does and more.
CEILING_TOLERANCE = 1.0


def conv_output(height: int, width: int, kernel: int, stride: int) -> tuple[int, int]:
    return (height - kernel) // stride + 1, (width - kernel) // stride + 1


def kernel_flops(op: str, shape: list[int]) -> int:
    """FLOPs of one call of a kernel (module docstring)."""
    if op in PRODUCTS:
        m, k, n = shape
        return 2 * m * k * n
    if op in CONVOLUTIONS:
        batch, channels, height, width, out_channels, kernel, stride = shape[:7]
        out_h, out_w = conv_output(height, width, kernel, stride)
        forward = 2 * batch * out_channels * out_h * out_w * channels * kernel * kernel
        return forward if op == "conv" else forward * (1 + shape[7])
    raise ValueError(f"unknown kernel {op!r} (allowed: {', '.join(KERNELS)})")


def thread_key(device_name: str, threads: int) -> int:
    """Threads matter on a CPU; a GPU's peaks do not depend on the host's thread count (stored as 0)."""
    return int(threads) if device_name == "cpu" else 0


def key(device_name: str, threads: int, op: str, dtype: str, shape: list[int]) -> tuple:
    return device_name, thread_key(device_name, threads), op, dtype, json.dumps(list(shape))


def quantity_key(need_or_row: dict[str, Any]) -> tuple:
    """The quantity a need (`need`) or a measured row asks for or gives."""
    return key(need_or_row["device_name"], need_or_row["threads"], need_or_row["op"], need_or_row["dtype"],
               need_or_row["shape"])


def needs_for_work(device: str, device_name: str, threads: int, work: dict[str, Any]) -> list[dict[str, Any]]:
    """What a run's reading needs measured: the roofs of its device and thread count at fp32 and at the
    dtype it computed in, and every kernel its phases ran. `work` is a trainer summary's `work`."""
    dtypes = list(dict.fromkeys(["float32", work["dtype"]]))
    needs = roof_needs(device, device_name, threads, dtypes)
    for phase in work["phases"].values():
        needs += [need(device, device_name, threads, k["op"], work["dtype"], k["shape"]) for k in phase["kernels"]]
    return unique(needs)


def roof_needs(device: str, device_name: str, threads: int, dtypes: list[str]) -> list[dict[str, Any]]:
    needs = [need(device, device_name, threads, ROOF, dtype, []) for dtype in dtypes]
    needs += [need(device, device_name, threads, MEMORY, "", []), need(device, device_name, threads, DISPATCH, "", [])]
    if device != "cpu":
        needs += [need(device, device_name, threads, op, "", []) for op in COPIES]
    return needs


def need(device: str, device_name: str, threads: int, op: str, dtype: str, shape: list[int]) -> dict[str, Any]:
    return {"device": device, "device_name": device_name, "threads": thread_key(device_name, threads), "op": op,
            "dtype": dtype, "shape": list(shape)}


def unique(needs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return list({quantity_key(n): n for n in needs}.values())


def busy(row: dict[str, Any]) -> bool:
    """Whether other processes were busy while the row was measured (the harness's interference account)."""
    return bool((row["method"].get("interference") or {}).get("contended"))


class Peaks:
    """For one machine, each quantity's fastest measurement (rows of the store's `peaks` table). A peak is a
    ceiling, and other work, seen or not (a shared host slows a process without a busy one in sight), only ever
    slows a measurement: measuring again can only bring a ceiling nearer what the machine can do. A quantity is
    settled once one of its measurements was taken on a quiet machine; until then it may read low."""

    def __init__(self, rows: pd.DataFrame):
        self.by_key: dict[tuple, dict[str, Any]] = {}
        self.settled: set[tuple] = set()
        for row in rows.to_dict("records"):
            at = quantity_key(row)
            if at not in self.by_key or row["value"] > self.by_key[at]["value"]:
                self.by_key[at] = row
            if not busy(row):
                self.settled.add(at)

    def missing(self, needs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The needs with no measurement taken on a quiet machine yet."""
        return [n for n in unique(needs) if quantity_key(n) not in self.settled]

    def unsettled(self, device_name: str, threads: int) -> int:
        """How many of this device's quantities were only ever measured beside other work."""
        device = device_name, thread_key(device_name, threads)
        return sum(1 for at in self.by_key if at[:2] == device and at not in self.settled)

    def of_device(self, device_name: str, threads: int) -> list[dict[str, Any]]:
        """The rows of this device at this thread count."""
        at = device_name, thread_key(device_name, threads)
        return [row for (name, t, *_), row in self.by_key.items() if (name, t) == at]

    def value(self, device_name: str, threads: int, op: str, dtype: str = "", shape: list[int] = ()) -> float:
        row = self.by_key.get(key(device_name, threads, op, dtype, list(shape)))
        return float(row["value"]) if row else math.nan

    def matmul_peak(self, device_name: str, threads: int, dtype: str) -> float:
        """The roof: the fastest matrix product or convolution measured on this device at this dtype, the
        model's own included (so no kernel's rate exceeds it)."""
        rates = [row["value"] for (name, t, op, d, _), row in self.by_key.items()
                 if (name, t, d) == (device_name, thread_key(device_name, threads), dtype) and op in (*KERNELS, ROOF)]
        return max(rates, default=math.nan)

    def kernel_seconds(self, device_name: str, threads: int, dtype: str, kernels: list[dict[str, Any]]) -> float:
        """Seconds per agent step the kernels take at their measured rates (NaN when one is unmeasured)."""
        return sum(k["per_step"] * kernel_flops(k["op"], k["shape"])
                   / self.value(device_name, threads, k["op"], dtype, k["shape"]) for k in kernels)

