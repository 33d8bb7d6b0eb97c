"""Other libraries' dispatch rules as data plus predictors (AITER, FlyDSL, CK, SGLang).

Each module reads the library's own tables or conditions and answers which config a launch takes,
so an experiment can say in advance where a kernel's bits will follow the batch.

- `aiter_pa_decode`, `aiter_unified_attention`, `aiter_flash_attn_varlen`: AITER's Triton attention.
- `aiter_pa_ragged`: AITER's HIP paged_attention_ragged as SGLang runs it (one variant per
  deployment) and the deployment setting (SGLang's context_len).
- `aiter_gdn_prefill_vk`: which state-recurrence kernel SGLang's call of chunk_gated_delta_rule_opt_vk takes.
- `flydsl_gdr_decode`: FlyDSL's tuned WARP_THREADS_K by batch size.
- `aiter_fused_gdn_prefill`: the fused GDN prefill's tile and chunk schedule.
- `sglang_gdn`: SGLang's AiterGDNKernel routing (decode HIP / FlyDSL / Triton; prefill AITER / Triton).
- `ck_batch_prefill`: CK batch prefill's hdim-128 tile switch by blocks against CUs.
- `aiter_gemm_a16w16`: AITER Triton gemm_a16w16's config by M, read from the installed wheel's JSON.
- `batch_variance_map`: per model, TP and arch, the batch sizes where each op's kernel or numerics change.
- `base`: the DispatchRule protocol; the new modules export a `RULE` implementing it.
"""
