"""The continuous-batching scheduler both back ends drive: one scheduler, two clocks.

No time and no device here: the simulator calls it from a SimPy process, the runtime from its host
loop, in the same order (docs/architecture.md, "The scheduler contract"):

- sync, per step: ``batch = schedule(now)``, run the forward, ``update(batch, tokens)``;
- async: ``b0 = schedule()``, launch b0, then loop: ``b1 = schedule()`` (b0's tokens unknown),
  launch b1, wait for b0's tokens, ``update(b0, tokens0)``, ``b0 = b1``.

Policy (vLLM V1 / nano-vllm): running requests first, in admission order, each with its next
query (one decode token, or its next prefill chunk), then waiting requests FIFO while
``workload.batch_size`` (running requests) and ``workload.max_batch_tokens`` (query tokens per step)
allow. KV blocks are allocated at schedule time for the tokens being computed; admission waits for
blocks; a running request that cannot get the block it needs preempts by recompute from the back
of the running queue (blocks freed, request back at the front of the waiting queue; re-admitted
later with prompt + outputs so far as its prompt, all re-prefilled). A step that preempted admits
nobody. Without ``workload.chunked_prefill`` a prompt must fit whole into the step's remaining
budget (a recompute longer than ``max_batch_tokens`` is chunked anyway: it could never run
otherwise).

Progress is committed optimistically: ``schedule`` grows each request's KV length by its query
tokens, and a sampled position adds one *pending* output; ``update`` fills pending outputs in and
retires finished requests, freeing their blocks (for later ``schedule`` calls only). A request
stops being scheduled once its last output (``max_new_tokens``) is scheduled; it leaves the
running queue then (its batch slot is free for the next ``schedule``) and keeps its blocks until
the ``update`` of that batch retires it. With EOS on (``ignore_eos`` false and an
``eos_token_id``), ``update`` of batch N retires a request that sampled EOS (the EOS token is its
last output); the request may already sit in batch N+1, and ``update`` of N+1 drops that output.
Freeing blocks that an in-flight batch still touches is safe because batches run in order on one
compute stream: a later batch that reuses the blocks writes them after the earlier one is done.
A preempted request with a pending output is re-admitted only after the ``update`` that fills it.

Modules (imports flow down the list): batch.py (``Batch``, ``carry_over_index``), table.py
(``RequestState``, the per-request table), blocks.py (the block tables), admission.py (the
waiting queue), inputs.py (input ids of prompt chunks), update.py (tokens in, finished out),
decode.py (the steady-decode fast path), scheduler.py (``Scheduler``: composes them; the running
queue and ``schedule``'s general path), drive.py (``default_num_kv_blocks``,
``run_to_completion``).
"""

from cbsim.scheduler.batch import Batch, carry_over_index
from cbsim.scheduler.drive import default_num_kv_blocks, run_to_completion
from cbsim.scheduler.scheduler import Scheduler
from cbsim.scheduler.table import DRAINING, FINISHED, RUNNING, WAITING, RequestState

__all__ = [
    "DRAINING",
    "FINISHED",
    "RUNNING",
    "WAITING",
    "Batch",
    "RequestState",
    "Scheduler",
    "carry_over_index",
    "default_num_kv_blocks",
    "run_to_completion",
]
