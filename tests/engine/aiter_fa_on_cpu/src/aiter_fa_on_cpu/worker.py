"""vLLM's CPU worker for a vLLM whose CPU ops are not compiled (the official wheel)."""

from __future__ import annotations

import math

from vllm.config import VllmConfig
from vllm.utils.cpu_resource_utils import get_memory_node_info, get_visible_memory_node
from vllm.v1.worker.cpu_worker import CPUWorker
from vllm.v1.worker.gpu_worker import Worker


class CpuWorkerWithoutMemoryBinding(CPUWorker):
    """vLLM's ``CPUWorker``, except that it does not bind the process to a memory node: that
    binding is ``torch.ops._C.init_cpu_memory_env``, which only vLLM's CPU build compiles. Its
    memory budget is the same fraction of the first visible node's memory; every other method is
    ``CPUWorker``'s and ``Worker``'s."""

    def __init__(
        self, vllm_config: VllmConfig, local_rank: int, rank: int,
        distributed_init_method: str, is_driver_worker: bool = False,
    ) -> None:  # fmt: skip
        node = get_visible_memory_node(vllm_config.parallel_config.assigned_physical_gpu_ids)[0]
        fraction = vllm_config.cache_config.resolved_gpu_memory_utilization
        self.requested_cpu_memory = math.ceil(get_memory_node_info(node).total_memory * fraction)
        Worker.__init__(self, vllm_config, local_rank, rank, distributed_init_method,
                        is_driver_worker=is_driver_worker)  # fmt: skip
        self.parallel_config.disable_custom_all_reduce = True
