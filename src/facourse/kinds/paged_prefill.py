"""The paged-prefill kind (step 15's second entry point): ``paged_prefill(q, k_cache, v_cache, block_table,
cu_seqlens_q, seq_lens, max_seqlen_q)``, new tokens of each sequence against step 09's paged cache; the varlen
kind's bench, its own cases and perf case (the reference reads the same keys gathered into packed rows)."""
from __future__ import annotations

from .varlen import Varlen


class PagedPrefill(Varlen):
    name = "paged_prefill"
    label = " (paged prefill)"

    check_default, checker = "chunks", ("facourse.serving", "check_paged_prefill")
    cases_attr, perf_case = "PAGED_CASES", "chunked_p16"

    def check_cases(self, m, r, solution):     # the step's second entry point: every paged case
        return self.all_cases()


KIND = PagedPrefill()
