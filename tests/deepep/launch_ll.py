# SPDX-License-Identifier: BSD-3-Clause
"""Runs DeepEP's own tests/test_low_latency.py, unmodified, with this project's process placement.

    DEEPEP_TREE=<DeepEP tree> python tests/deepep/launch_ll.py [test_low_latency.py's arguments]

What differs from running the test file directly, and why (nothing else does):
  * tests/utils.py's init_dist() is replaced, before the test's code binds it, by one that puts rank
    r on GPU r % device_count instead of GPU r, so that 2 ranks can share one GPU under CUDA MPS;
  * the process group backend is gloo when ranks share a GPU (NCCL refuses two ranks on one device:
    "Duplicate GPU detected"), nccl otherwise; DEEPEP_PG_BACKEND overrides it;
  * with gloo, dist.all_gather_into_tensor into a (world, *shape) tensor is done as all_gather +
    copy (torch 2.11's gloo rejects that output shape);
  * DEEPEP_DUMP_AFTER=S: every rank writes every thread's Python stack to stderr every S seconds
    (faulthandler), so that a run that hangs says where each rank waits;
  * DEEPEP_TRACE_CALLS=N: every rank prints its first N low_latency_dispatch / low_latency_combine
    calls (number, keyword arguments that select a kernel variant) as it makes them, so that a run
    that hangs says which call it hangs in;
  * DEEPEP_SYNC_CALLS=1: before every low_latency_dispatch / low_latency_combine call each rank waits
    for its GPU and then for the other ranks (torch.cuda.synchronize, a process group barrier), so
    that the ranks' kernels are launched together. A probe for ranks sharing one GPU under MPS,
    where one rank's first combine kernel never posts (results/gpu-2026-11-29e; launching together
    did not change that). The kernels, and DeepEP's per-kernel timings, are unchanged; wall-clock
    figures of the test are not comparable.
The test's kernels calls, data, correctness checks and timings are DeepEP's. The test code is read
from $DEEPEP_TREE/tests/test_low_latency.py (or tests/legacy/ on DeepEP main) and executed in this
module, so that torch.multiprocessing's spawned children find test_loop here.
"""
import inspect
import os
import sys

tree = os.environ.get('DEEPEP_TREE')
if not tree:
    sys.exit('launch_ll.py: set DEEPEP_TREE to the DeepEP source tree')
test_dir = None
for sub in ('tests', os.path.join('tests', 'legacy')):
    if os.path.isfile(os.path.join(tree, sub, 'test_low_latency.py')):
        test_dir = os.path.join(tree, sub)
        break
if test_dir is None:
    sys.exit(f'launch_ll.py: no tests/test_low_latency.py or tests/legacy/test_low_latency.py in {tree}')
sys.path.insert(0, test_dir)
sys.path.insert(0, tree)  # deep_ep package and the deep_ep_cpp extension built in place

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import utils as deepep_test_utils  # noqa: E402  (DeepEP's tests/utils.py)


def _all_gather_into_tensor_compat(original):
    # torch 2.11's gloo rejects an output shaped (world, *input.shape) ("invalid tensor size"),
    # which is how DeepEP's test calls it; gather into a list and copy instead.
    def gather(output, input, group=None, async_op=False):
        if output.dim() != input.dim() + 1 or async_op:
            return original(output, input, group=group, async_op=async_op)
        parts = [torch.empty_like(input) for _ in range(output.shape[0])]
        dist.all_gather(parts, input.contiguous(), group=group)
        for i, part in enumerate(parts):
            output[i].copy_(part)
        return None
    return gather


def init_dist(local_rank: int, num_local_ranks: int):
    ip = os.getenv('MASTER_ADDR', '127.0.0.1')
    port = int(os.getenv('MASTER_PORT', '8361'))
    num_nodes = int(os.getenv('WORLD_SIZE', 1))
    node_rank = int(os.getenv('RANK', 0))
    num_devices = torch.cuda.device_count()
    if num_devices == 0:
        raise RuntimeError('launch_ll.py: no CUDA device')
    device = local_rank % num_devices
    shared = num_local_ranks > num_devices
    backend = os.getenv('DEEPEP_PG_BACKEND') or ('gloo' if shared else 'nccl')
    params = {
        'backend': backend,
        'init_method': f'tcp://{ip}:{port}',
        'world_size': num_nodes * num_local_ranks,
        'rank': node_rank * num_local_ranks + local_rank,
    }
    if backend == 'nccl' and 'device_id' in inspect.signature(dist.init_process_group).parameters:
        params['device_id'] = torch.device(f'cuda:{device}')
    torch.cuda.set_device(device)
    dump_after = float(os.getenv('DEEPEP_DUMP_AFTER', '0') or 0)
    if dump_after > 0:
        import faulthandler
        faulthandler.dump_traceback_later(dump_after, repeat=True, file=sys.stderr)
    dist.init_process_group(**params)
    if backend == 'gloo':
        dist.all_gather_into_tensor = _all_gather_into_tensor_compat(dist.all_gather_into_tensor)
    torch.set_default_dtype(torch.bfloat16)
    torch.set_default_device('cuda')
    torch.cuda.set_device(device)
    print(f'[launch_ll] rank {params["rank"]}/{params["world_size"]} on cuda:{device} '
          f'({num_devices} device(s)), process group {backend}, '
          f'MPS thread percentage {os.getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "-")}, '
          f'{torch.cuda.get_device_properties(device).multi_processor_count} SMs visible', flush=True)
    return dist.get_rank(), dist.get_world_size(), dist.new_group(list(range(num_local_ranks * num_nodes)))


deepep_test_utils.init_dist = init_dist

_trace_calls = int(os.getenv('DEEPEP_TRACE_CALLS', '0') or 0)
_sync_calls = os.getenv('DEEPEP_SYNC_CALLS', '0') not in ('', '0')
if _trace_calls > 0 or _sync_calls:
    import deep_ep as _deep_ep
    _calls = [0]

    def _traced(name):
        original = getattr(_deep_ep.Buffer, name)
        keys = ('use_fp8', 'round_scale', 'use_ue8m0', 'use_logfmt', 'zero_copy', 'async_finish',
                'return_recv_hook')

        def call(self, *args, **kwargs):
            _calls[0] += 1
            if _calls[0] <= _trace_calls:
                shown = ' '.join(f'{k}={kwargs[k]}' for k in keys if k in kwargs)
                rank = dist.get_rank() if dist.is_initialized() else -1
                print(f'[launch_ll] rank {rank} call {_calls[0]}: {name} {shown}', file=sys.stderr, flush=True)
            if _sync_calls:
                torch.cuda.synchronize()
                dist.barrier()
            return original(self, *args, **kwargs)
        setattr(_deep_ep.Buffer, name, call)

    _traced('low_latency_dispatch')
    _traced('low_latency_combine')

# --pressure-test loops over range(int(1e9)) seeds; DEEPEP_PRESSURE_SEEDS=N bounds that one loop to N
# seeds (each seed still runs the test's own 1 + 20 hash-checked rounds). Only a range whose sole
# argument is 1e9 is bounded; every other range is the builtin's.
_pressure_seeds = int(os.getenv('DEEPEP_PRESSURE_SEEDS', '0') or 0)
if _pressure_seeds > 0:
    import builtins as _builtins

    def range(*a):  # noqa: A001  (shadows the builtin for the test's code only)
        if len(a) == 1 and a[0] == int(1e9):
            return _builtins.range(_pressure_seeds)
        return _builtins.range(*a)
_test_file = os.path.join(test_dir, 'test_low_latency.py')
with open(_test_file) as _f:
    _code = compile(_f.read(), _test_file, 'exec')
# Runs the test's definitions here; its `if __name__ == '__main__'` block runs in the parent only
# (spawned children import this file as __mp_main__).
exec(_code, globals())
