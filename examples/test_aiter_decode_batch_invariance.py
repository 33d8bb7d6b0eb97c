"""SGLang's MI35x kernel test, test_aiter_decode_batch_invariance, over gdn_lab's helper.

`pytest examples/test_aiter_decode_batch_invariance.py`: on ROCm with aiter installed it checks
AITER's paged_attention_ragged (backend `aiter`) on SGLang's cases (targets 1/255/256/257/4000/12000,
batches of 2/8/33 at a random position, batchmates of 1..16383 tokens, bf16 and fp8 KV, token-level
pages). Elsewhere it checks the lab's portable Triton backend; on the CPU, in Triton's interpreter,
on `CPU_CASES` (the same targets up to 257 and batches of 2 and 8 with batchmates of up to 600
tokens, float16 and fp8, 8/2/64 heads: SGLang's full cases take hours in the interpreter).
"""

import torch

from gdn_lab import routing
from gdn_lab.testing import SGLANG_DECODE_CASES, assert_batch_invariant

CPU_CASES = [
    {"targets": [1, 255, 256, 257], "batch_sizes": [2, 8], "max_context": 600, "kv_dtypes": [None, "fp8"],
     "dtype": "float16", "attention": {"num_q_heads": 8, "num_kv_heads": 2, "head_dim": 64, "page_size": 1}},
]  # fmt: skip
BACKEND = "aiter" if "aiter" in routing.backend_names("decode_attention") and torch.version.hip else "triton"


def test_aiter_decode_batch_invariance():
    cases = SGLANG_DECODE_CASES if torch.cuda.is_available() else CPU_CASES
    assert_batch_invariant("decode_attention", BACKEND, cases=cases)
