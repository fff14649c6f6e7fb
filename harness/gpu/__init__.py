"""The GPU as a resource shared by every kb-mcp process of the machine: the GPU lane (`lane`, its
machine-wide lock files `lane_file`, its key `gpu_key`, the cheap look for a GPU `gpu_probe`) and the
device's memory (`memory`: a verification's memory plan, pure arithmetic; `gpu_memory`: its use
sampled through NVML). No torch. It uses nothing of ours but `kb`."""
