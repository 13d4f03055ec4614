"""A matmul on the tpu device: prints the PJRT platform and the result."""

import torch

import torchtpu  # noqa: F401  (optional: torch autoloads it through its entry point)

a = torch.arange(6, dtype=torch.float32).reshape(2, 3).to("tpu")
b = torch.ones(3, 2, device="tpu")
c = a @ b
print("platform:", torch.tpu.get_device_name(), torchtpu.runtime_info()["platform_version"])
print("device:", c.device)
print(c.cpu())
