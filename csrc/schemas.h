// The schema of every compiled op, in one place. specops._C defines them in the specops::
// namespace (whose CPU kernels it holds; specops._C_cuda adds the CUDA kernels), and the test-only
// emulator build specops._C_cudasim defines them again in specops_cudasim::, where the same CUDA
// sources run on CPU tensors. Mutation marks: kv_compact and kv_compact_paged write both caches
// in place; apply_token_bitmask writes -inf into the logits in place; tree_attention(_paged) writes its split partials into `workspace` (fp32 scratch that a
// TreeAttentionPlan allocates once per step, see csrc/tree_attention_args.h);
// `invariant` selects the batch-invariant schedule (docs/batch_invariance.md).
#pragma once

#define SPECOPS_DEFINE_SCHEMAS(m)                                                                          \
  do {                                                                                                    \
    m.def("build_tree_mask(Tensor parents, Tensor num_nodes) -> (Tensor mask, Tensor depth)");            \
    m.def("tree_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor prefix_lens, Tensor block_lens, " \
          "Tensor mask, Tensor? q_lens, float sm_scale, int num_splits=1, Tensor(a!)? workspace=None, "         \
          "bool invariant=False) -> Tensor"); \
    m.def("tree_attention_paged(Tensor q, Tensor k_pages, Tensor v_pages, Tensor page_table, "           \
          "Tensor prefix_lens, Tensor block_lens, Tensor mask, Tensor? q_lens, float sm_scale, "            \
          "int num_splits=1, Tensor(a!)? workspace=None, bool invariant=False) -> Tensor");                                      \
    /* The same ops without the workspace (a split call allocates its partials): no mutated      */     \
    /* argument, so inductor can call them as opaque nodes of a compiled graph.                   */     \
    m.def("tree_attention.functional(Tensor q, Tensor k_cache, Tensor v_cache, Tensor prefix_lens, "      \
          "Tensor block_lens, Tensor mask, Tensor? q_lens, float sm_scale, int num_splits=1, "             \
          "bool invariant=False) -> Tensor");                                                             \
    m.def("tree_attention_paged.functional(Tensor q, Tensor k_pages, Tensor v_pages, Tensor page_table, " \
          "Tensor prefix_lens, Tensor block_lens, Tensor mask, Tensor? q_lens, float sm_scale, "            \
          "int num_splits=1, bool invariant=False) -> Tensor");                                           \
    m.def("kv_compact(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor prefix_lens, Tensor accept_idx, "   \
          "Tensor accept_lens) -> ()");                                                                   \
    m.def("kv_compact_paged(Tensor(a!) k_pages, Tensor(b!) v_pages, Tensor page_table, "                 \
          "Tensor prefix_lens, Tensor accept_idx, Tensor accept_lens) -> ()");                            \
    m.def("warp_probs(Tensor logits, Tensor temperature, Tensor top_k, Tensor top_p) -> Tensor");         \
    m.def("verify_greedy(Tensor tokens, Tensor parents, Tensor target_logits, Tensor num_nodes, "         \
          "Tensor? bitmask=None) -> (Tensor accept_idx, Tensor accept_lens, Tensor bonus)");              \
    m.def("verify_tree(Tensor tokens, Tensor parents, Tensor target_probs, Tensor uniforms, "             \
          "Tensor? draft_probs, Tensor num_nodes, str mode) -> (Tensor accept_idx, Tensor accept_lens, "   \
          "Tensor bonus)");                                                                               \
    m.def("verify_tree_logits(Tensor tokens, Tensor parents, Tensor target_logits, Tensor uniforms, "      \
          "Tensor temperature, Tensor top_k, Tensor top_p, Tensor? draft_logits, Tensor draft_temperature, " \
          "Tensor draft_top_k, Tensor draft_top_p, Tensor num_nodes, str mode, Tensor? bitmask=None) -> "    \
          "(Tensor accept_idx, Tensor accept_lens, Tensor bonus)");                                       \
    m.def("verify_joint(Tensor draft_tokens, Tensor target_logprobs, Tensor draft_joint_logprobs, "       \
          "Tensor log_tau, Tensor uniforms) -> (Tensor accept_idx, Tensor accept_lens, Tensor bonus)");    \
    m.def("verify_joint_logits(Tensor draft_tokens, Tensor target_logits, Tensor draft_joint_logprobs, "   \
          "Tensor log_tau, Tensor uniforms, Tensor temperature, Tensor top_k, Tensor top_p, "               \
          "Tensor bonus_temperature, Tensor bonus_top_k, Tensor bonus_top_p, Tensor num_nodes) -> "         \
          "(Tensor accept_idx, Tensor accept_lens, Tensor bonus)");                                       \
    m.def("topn_expand(Tensor parent_scores, Tensor child_logprobs, int n, int per_parent_k) -> "          \
          "(Tensor scores, Tensor tokens, Tensor parents)");                                              \
    m.def("select_topn_subtree(Tensor parents, Tensor scores, Tensor num_nodes, int n) -> "               \
          "(Tensor keep_idx, Tensor new_parents, Tensor counts)");                                        \
    m.def("linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");                                      \
    /* linear from the packed copy of a bf16 weight (CPU only: ops/linear pack_weight)          */     \
    m.def("linear_packed(Tensor x, Tensor weight, Tensor packed, Tensor? bias) -> Tensor");                \
    m.def("apply_token_bitmask(Tensor(a!) logits, Tensor bitmask) -> ()");                                 \
  } while (0)
