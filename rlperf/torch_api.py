"""The torch releases rlperf runs on: the oldest it supports (TORCH_FLOOR, the `torch>=` of pyproject.toml)
and the torch API it uses whose first release matters, each with that release and how it was established.

API that appeared after the floor is reached only through `torch_has` (or `getattr` with a default), beside
a fallback for the older releases: an older torch then takes the fallback instead of raising AttributeError
after a whole run. tests/test_torch_api.py walks the code and fails on any other use of such API, and on any
torch name or keyword the code starts to use before someone has checked it against the floor.

Evidence below is the Python sources, type stubs and libtorch_python.so of each release's wheel on PyPI.
Importing this module does not import torch.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from rlperf.errors import BadInput


class Since(NamedTuple):
    release: tuple[int, int]
    evidence: str


# The CUDA device's UUID is what matches a run's GPU with NVML's (the sampler, the interference monitor, the
# summary's device_uuid), and no torch before 2.5 exposes it, nor the GPU's PCI bus id NVML could find it by.
TORCH_FLOOR = (2, 5)

VERSIONED_API: dict[str, Since] = {
    "torch.cuda.get_device_properties().uuid": Since(
        (2, 5), "pytorch#125083 registers _CUuuid and _CudaDeviceProperties.uuid: absent from 2.4.0's "
                "libtorch_python.so and _C/__init__.pyi, present in 2.5.0's"),
    "torch.backends.cudnn.rnn.fp32_precision": Since(
        (2, 9), "2.9.0's torch/backends/cudnn/__init__.py makes `rnn` an _FP32Precision('cuda', 'rnn'); up to "
                "2.8.0 `rnn` is the module torch/backends/cudnn/rnn.py, which has no fp32_precision"),
    # rlperf attach's hooks (profilers/attach.py): a module's forward, an optimizer's step, in every module and
    # optimizer of the process, registered once, without touching the trainer's code
    "torch.nn.modules.module.register_module_forward_pre_hook": Since(
        (1, 6), "pytorch#38972 adds the global module hooks to torch/nn/modules/module.py (May 2020, torch 1.6)"),
    "torch.nn.modules.module.register_module_forward_hook": Since(
        (1, 6), "pytorch#38972, as register_module_forward_pre_hook"),
    "torch.nn.modules.module.register_module_forward_hook(always_call=)": Since(
        (2, 1), "pytorch#104278 adds always_call to the global and the module's forward hooks (June 2023, torch "
                "2.1): the hook runs when forward raises too, so the count of open calls stays right"),
    "torch.optim.optimizer.register_optimizer_step_pre_hook": Since(
        (2, 0), "pytorch#89176 adds the global optimizer step pre and post hooks to torch/optim/optimizer.py "
                "(November 2022, torch 2.0)"),
    "torch.optim.optimizer.register_optimizer_step_post_hook": Since((2, 0), "pytorch#89176, as the pre hook"),
    "torch.distributed.all_gather_single": Since(
        (2, 13), "absent from torch/distributed/distributed_c10d.py up to 2.12.0; 2.13.0 adds it and deprecates "
                 "all_gather_into_tensor for it"),
    "torch.distributed.reduce_scatter_single": Since(
        (2, 13), "absent from torch/distributed/distributed_c10d.py up to 2.12.0; 2.13.0 adds it and deprecates "
                 "reduce_scatter_tensor for it"),
}


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string: `2.5.1+cu124`, `2.6.0a0+git1234`, `2.13.0`."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None:
        raise BadInput(f"torch: cannot read the version {version!r}")
    return int(found[1]), int(found[2])


def supported_torch() -> None:
    """Refuses, in one line, a torch older than the floor, before anything is run with it."""
    import torch

    if release(torch.__version__) < TORCH_FLOOR:
        floor = ".".join(map(str, TORCH_FLOOR))
        raise BadInput(f"torch: {torch.__version__} is older than {floor}, the oldest rlperf supports "
                       f"(allowed: torch {floor} or newer)")


def torch_has(api: str) -> bool:
    """Whether this torch has `api`, a dotted path of VERSIONED_API newer than the floor (asking of anything
    else is a mistake in the code: API at or below the floor is used directly, API not listed is listed first)."""
    if api not in VERSIONED_API or VERSIONED_API[api].release <= TORCH_FLOOR:
        raise KeyError(f"{api} is not API newer than the floor in rlperf.torch_api.VERSIONED_API")
    import torch

    owner, _, name = api.removeprefix("torch.").rpartition(".")
    target = torch
    for part in owner.split(".") if owner else ():
        target = getattr(target, part, None)
        if target is None:
            return False
    return hasattr(target, name)
