"""Compile every Triton kernel of eagle_kernels.ops for sm_90 without a GPU: catches what the
interpreter accepts but the compiler rejects (non-constexpr globals, loop-carried type
changes, ...).

Run as a script with TRITON_INTERPRET unset (tests/test_triton_compile.py does, in a subprocess):
under the interpreter @triton.jit returns interpreted functions that cannot be compiled.
"""
import os
import time

assert os.environ.get("TRITON_INTERPRET", "0") != "1", "run without TRITON_INTERPRET=1"
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from eagle_kernels.ops import (acceptance, attention_triton, decoder_triton, kv, loss,  # noqa: E402
                               sampling, topk, tree)

TARGET = GPUTarget("cuda", 90, 32)  # H100 / H200
H100_SHARED_BYTES = 232448  # 227 KiB: the most shared memory one block may use on sm_90
TOO_MUCH_SHARED = []
# launched with attention_triton.EXACT_ROUNDING (no multiply-add contraction)
EXACT_ROUNDING_KERNELS = (decoder_triton._rope_kernel, kv._rope_write_kv_kernel,
                          attention_triton._prefix_splits_kernel,
                          attention_triton._tree_tail_kernel,
                          attention_triton._tree_attention_kernel,
                          attention_triton._merge_splits_kernel)


def build(fn, signature, constexprs, label="default"):
    """Compile one specialization; ``constexprs`` also holds integer arguments equal to 1,
    which the runtime specializes as constants (so they compile differently)."""
    start = time.time()
    signature = {**{k: v for k, v in signature.items() if k not in constexprs},
                 **{name: "constexpr" for name in constexprs}}
    source = ASTSource(fn, signature, constexprs={(fn.arg_names.index(name),): value
                                                  for name, value in constexprs.items()})
    options = {"num_warps": 4, "enable_fp_fusion": fn not in EXACT_ROUNDING_KERNELS}
    kernel = triton.compile(source, target=TARGET, options=options)
    shared = kernel.metadata.shared
    if shared > H100_SHARED_BYTES:
        TOO_MUCH_SHARED.append(f"{fn.__name__} [{label}]: {shared} B")
    print(f"{fn.__name__} [{label}]: compiled for sm_90 in {time.time() - start:.1f} s "
          f"(shared {shared} B)", flush=True)


def variants(fn, signature, constexprs, **changes):
    """The default build plus one build per named change ({argument: dtype or value})."""
    build(fn, signature, constexprs)
    for label, change in changes.items():
        types = {k: v for k, v in change.items() if isinstance(v, str) and v[:1] in "*fi"
                 and k in signature and k not in constexprs}
        values = {k: v for k, v in change.items() if k not in types}
        build(fn, {**signature, **types}, {**constexprs, **values}, label)


variants(topk._topk_chunk_kernel,
         {"logits_ptr": "*bf16", "keys_ptr": "*i64", "max_ptr": "*fp32", "sum_ptr": "*fp32",
          "vocab": "i32", "chunks": "i32"},
         {"K": 10, "KP": 16, "CHUNK": 2048},
         fp32={"logits_ptr": "*fp32"}, k_one={"K": 1, "KP": 1})
variants(topk._topk_merge_kernel,
         {"logits_ptr": "*bf16", "d2t_ptr": "*i64", "keys_ptr": "*i64", "max_ptr": "*fp32",
          "sum_ptr": "*fp32", "values_ptr": "*fp32", "ids_ptr": "*i64", "vocab": "i32",
          "chunks": "i32"},
         {"K": 10, "KP": 16, "CP": 16, "HAS_D2T": True},
         no_d2t={"HAS_D2T": False, "logits_ptr": "*fp32"}, k_one={"K": 1, "KP": 1},
         one_chunk={"chunks": 1, "CP": 1}, vocab_152k_k64={"CP": 128, "K": 64, "KP": 64})
variants(topk._expand_kernel,
         {"frontier_ptr": "*fp32", "child_ptr": "*fp32", "candidate_ptr": "*fp32",
          "next_index_ptr": "*i64", "next_scores_ptr": "*fp32", "frontier": "i32",
          "children": "i32"},
         {"TOP": 10, "BLOCK": 128, "RB": 128}, ones={"frontier": 1, "children": 1})
variants(tree._build_tree_kernel,
         {"parents_ptr": "*i32", "depth_ptr": "*i32", "mask_ptr": "*i32", "paths_ptr": "*i32",
          "flags_ptr": "*i32", "num_nodes": "i32", "words": "i32", "width": "i32"},
         {"NP": 64, "WP": 2, "JB": 32}, ones={"words": 1, "width": 1, "WP": 1})
RERANK_ARGS = {
    "root_ptr": "*i64", "cand_tokens_ptr": "*i64", "cand_scores_ptr": "*fp32",
    "cand_parents_ptr": "*i32", "tokens_ptr": "*i64", "parents_ptr": "*i32", "depth_ptr": "*i32",
    "scores_ptr": "*fp32", "mask_ptr": "*i32", "paths_ptr": "*i32", "selected_ptr": "*i64",
    "node_of_ptr": "*i32", "flags_ptr": "*i32", "candidates": "i32", "num_nodes": "i32",
    "words": "i32", "width": "i32"}
build(tree._rerank_kernel, RERANK_ARGS, {"MP": 1024, "RB": 16, "NP": 64, "WP": 2, "JB": 32})

OUTPUTS = {"out_tokens_ptr": "*i64", "num_acc_ptr": "*i32", "out_nodes_ptr": "*i32"}
STATS = {"m_ptr": "*fp32", "kkey_ptr": "*i32", "tau_ptr": "*fp32", "z_ptr": "*fp32"}
build(acceptance._argmax_kernel, {"logits_ptr": "*bf16", "out_ptr": "*i64", "vocab": "i32"},
      {"BLOCK": 2048})
variants(acceptance._greedy_paths_kernel,
         {"tokens_ptr": "*i64", "paths_ptr": "*i32", "target_ptr": "*i64", **OUTPUTS,
          "num_nodes": "i32", "num_paths": "i32", "width": "i32"},
         {"BLOCK_P": 64, "BLOCK_W": 8}, ones={"num_paths": 1, "width": 1})
SAMPLING_PARAMS = {"temp_ptr": "*fp32", "temp": "fp32", "top_k_ptr": "*i64", "top_k": "i32",
                   "top_p_ptr": "*fp32", "top_p": "fp32"}
SAMPLING_FLAGS = {"TEMP_PER_ROW": True, "TOP_K_PER_ROW": True, "TOP_P_PER_ROW": True,
                  "HAS_TOP_K": True, "HAS_TOP_P": True, "BLOCK": 2048}
NO_TOP_K_NOR_P = {"TEMP_PER_ROW": False, "TOP_K_PER_ROW": False, "TOP_P_PER_ROW": False,
                  "HAS_TOP_K": False, "HAS_TOP_P": False, "logits_ptr": "*fp32"}
variants(sampling._target_probs_kernel,
         {"logits_ptr": "*bf16", "out_ptr": "*fp32", **SAMPLING_PARAMS, "vocab": "i32"},
         SAMPLING_FLAGS, neither_top_k_nor_top_p=NO_TOP_K_NOR_P)
variants(sampling._row_stats_kernel,
         {"logits_ptr": "*bf16", **STATS, **SAMPLING_PARAMS, "vocab": "i32",
          "rows_per_param": "i32"}, SAMPLING_FLAGS,
         top_k_only_fp32={**NO_TOP_K_NOR_P, "HAS_TOP_K": True, "rows_per_param": 1})
variants(sampling._chunk_stats_kernel,
         {"logits_ptr": "*bf16", "max_ptr": "*fp32", "sum_ptr": "*fp32", "temp_ptr": "*fp32",
          "temp": "fp32", "vocab": "i32", "chunks": "i32", "rows_per_param": "i32"},
         {"TEMP_PER_ROW": True, "CHUNK": 2048},
         scalar_temperature_fp32={"TEMP_PER_ROW": False, "logits_ptr": "*fp32",
                                  "rows_per_param": 1})
variants(sampling._merge_stats_kernel,
         {"max_ptr": "*fp32", "sum_ptr": "*fp32", **STATS, "chunks": "i32"}, {"CP": 16},
         one_chunk={"chunks": 1, "CP": 1})
BONUS_INPUTS = {"logits_ptr": "*bf16", "draft_ptr": "*fp32", **STATS, "temp_ptr": "*fp32",
                "temp": "fp32", "row_ptr": "*i64", "q_row_ptr": "*i64", "removed_ptr": "*i64",
                "num_removed_ptr": "*i32", "sums_ptr": "*fp32", "lasts_ptr": "*i32",
                "vocab": "i32", "chunks": "i32", "removed_stride": "i32"}
BONUS_CHAIN = {"TEMP_PER_ROW": True, "HAS_Q": True, "HAS_REMOVED": False, "CHUNK": 2048}
BONUS_TREE = {"TEMP_PER_ROW": False, "HAS_Q": False, "HAS_REMOVED": True, "logits_ptr": "*fp32"}
variants(sampling._bonus_chunk_kernel, BONUS_INPUTS, BONUS_CHAIN, tree=BONUS_TREE)
variants(sampling._bonus_pick_kernel,
         {**BONUS_INPUTS, "bonus_u_ptr": "*fp32", "num_acc_ptr": "*i32", "out_tokens_ptr": "*i64",
          "width": "i32"}, {**BONUS_CHAIN, "CP": 16}, tree=BONUS_TREE,
         one_chunk={"chunks": 1, "CP": 1})
ACCEPT_INPUTS = {"logits_ptr": "*bf16", "accept_u_ptr": "*fp32", **STATS, "temp_ptr": "*fp32",
                 "temp": "fp32", **OUTPUTS, "num_nodes": "i32", "vocab": "i32"}
variants(acceptance._stochastic_tree_kernel,
         {"tokens_ptr": "*i64", "parents_ptr": "*i32", **ACCEPT_INPUTS, "bonus_row_ptr": "*i64",
          "removed_ptr": "*i64", "num_removed_ptr": "*i32", "width": "i32"},
         {"TEMP_PER_ROW": True, "BLOCK_N": 64, "BLOCK_W": 8},
         scalar_temperature_fp32={"TEMP_PER_ROW": False, "logits_ptr": "*fp32", "width": 1})
variants(acceptance._stochastic_chain_kernel,
         {"tokens_ptr": "*i64", "draft_ptr": "*fp32", **ACCEPT_INPUTS, "bonus_row_ptr": "*i64",
          "q_row_ptr": "*i64"}, {"TEMP_PER_ROW": True, "BLOCK_W": 8},
         one_node={"num_nodes": 1, "BLOCK_W": 1})
variants(kv._compact_kv_kernel,
         {"base_ptr": "*bf16", "offsets_ptr": "*i64", "row_words_ptr": "*i64",
          "cache_lens_ptr": "*i32", "nodes_ptr": "*i32", "num_accepted_ptr": "*i32",
          "max_len": "i32", "width": "i32"}, {"WORD_BYTES": 8, "BLOCK": 1024},
         words_4={"WORD_BYTES": 4}, words_2={"WORD_BYTES": 2},
         words_1={"WORD_BYTES": 1, "width": 1})
variants(kv._write_kv_kernel,
         {"k_ptr": "*bf16", "v_ptr": "*bf16", "k_cache_ptr": "*bf16", "v_cache_ptr": "*bf16",
          "lens_ptr": "*i32", "count": "i32", "max_len": "i32", "offset": "i32",
          "row_size": "i32"}, {"BLOCK": 1024},
         decode_fp32={"k_ptr": "*fp32", "v_ptr": "*fp32", "k_cache_ptr": "*fp32",
                      "v_cache_ptr": "*fp32", "count": 1, "BLOCK": 128})
variants(kv._rope_write_kv_kernel,
         {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "positions_ptr": "*i64",
          "cos_ptr": "*bf16", "sin_ptr": "*bf16", "q_out_ptr": "*bf16", "k_cache_ptr": "*bf16",
          "v_cache_ptr": "*bf16", "lens_ptr": "*i32", "count": "i32", "q_heads": "i32",
          "kv_heads": "i32", "table_rows": "i32", "max_len": "i32", "offset": "i32"},
         {"DIM": 128, "BLOCK_H": 32, "BLOCK_KV": 8, "BLOCK_D": 128, "UPCAST": False},
         fp32_padded={"q_ptr": "*fp32", "k_ptr": "*fp32", "v_ptr": "*fp32", "cos_ptr": "*fp32",
                      "sin_ptr": "*fp32", "q_out_ptr": "*fp32", "k_cache_ptr": "*fp32",
                      "v_cache_ptr": "*fp32", "DIM": 80, "BLOCK_H": 16, "BLOCK_KV": 4,
                      "kv_heads": 1})
ATTENTION_ARGS = {
    "q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "lens_ptr": "*i32", "mask_ptr": "*i32",
    "out_ptr": "*bf16", "part_o_ptr": "*fp32", "part_ml_ptr": "*fp32", "num_queries": "i32",
    "q_heads": "i32", "tree_keys": "i32", "words": "i32", "num_splits": "i32", "max_len": "i32",
    "scale_log2": "fp32", "stride_qb": "i32", "stride_qn": "i32", "stride_qh": "i32",
    "stride_kb": "i32", "stride_kn": "i32", "stride_kh": "i32"}
PREFIX_ARGS = {k: v for k, v in ATTENTION_ARGS.items() if k not in ("mask_ptr", "out_ptr", "words")}
PREFIX_ARGS["split_keys"] = "i32"
TAIL_ARGS = {**ATTENTION_ARGS, "slots_ptr": "*i32", "split_keys": "i32"}
FP32_ATTENTION = {"q_ptr": "*fp32", "k_ptr": "*fp32", "v_ptr": "*fp32", "out_ptr": "*fp32",
                  "DOT_PRECISION": "ieee"}
TILES = {"GROUP": 4, "HEAD_DIM": 128, "BLOCK_D": 128, "BLOCK_M": 16, "BLOCK_N": 64,
           "DOT_PRECISION": "tf32", "UPCAST": False}
variants(attention_triton._prefix_splits_kernel, PREFIX_ARGS, TILES,
         head_dim_64={"HEAD_DIM": 64, "BLOCK_D": 64, "GROUP": 3},
         head_dim_256={"HEAD_DIM": 256, "BLOCK_D": 256, "BLOCK_N": 32},
         decode_ones={"GROUP": 1, "num_queries": 1, "tree_keys": 1, "num_splits": 1},
         fp32={k: v for k, v in FP32_ATTENTION.items() if k != "out_ptr"})
variants(attention_triton._tree_tail_kernel, TAIL_ARGS,
         {**TILES, "BLOCK_T": 64, "NODE_SLOTS": 5},
         tree_256={"BLOCK_T": 256},
         head_dim_64={"HEAD_DIM": 64, "BLOCK_D": 64, "GROUP": 3},
         head_dim_256={"HEAD_DIM": 256, "BLOCK_D": 256, "BLOCK_N": 32, "BLOCK_T": 256},
         ones={"GROUP": 1, "num_splits": 1, "words": 1, "num_queries": 1, "tree_keys": 1,
               "BLOCK_T": 1},
         fp32={**FP32_ATTENTION},
         fp16_head_dim_64={"q_ptr": "*fp16", "k_ptr": "*fp16", "v_ptr": "*fp16",
                           "out_ptr": "*fp16", "HEAD_DIM": 64, "BLOCK_D": 64})
variants(attention_triton._tree_attention_kernel, ATTENTION_ARGS,  # slot order
         {**TILES, "BLOCK_M": 64, "SPLIT": True},
         no_split_ones={"SPLIT": False, "num_splits": 1, "words": 1, "GROUP": 1, "BLOCK_M": 16},
         fp32={**FP32_ATTENTION, "HEAD_DIM": 256, "BLOCK_D": 256, "BLOCK_N": 32},
         fp16_head_dim_64={"q_ptr": "*fp16", "k_ptr": "*fp16", "v_ptr": "*fp16",
                           "out_ptr": "*fp16", "HEAD_DIM": 64, "BLOCK_D": 64, "BLOCK_M": 32})
variants(attention_triton._merge_splits_kernel,
         {"part_o_ptr": "*fp32", "part_ml_ptr": "*fp32", "out_ptr": "*bf16", "num_splits": "i32",
          "rows_per_batch": "i32"},
         {"HEAD_DIM": 128, "BLOCK_D": 128, "UPCAST": False},
         head_dim_64_fp32={"HEAD_DIM": 64, "BLOCK_D": 64, "out_ptr": "*fp32"},
         head_dim_256={"HEAD_DIM": 256, "BLOCK_D": 256})
LINEAR_ARGS = {"x_ptr": "*bf16", "rows": "i32", "width": "i32",
               **{f"{name}{i}{ptr}": kind for i in range(decoder_triton.LINEAR_GROUP_MAX)
                  for name, ptr, kind in (("w", "_ptr", "*bf16"), ("bias", "_ptr", "*bf16"),
                                          ("out", "_ptr", "*bf16"), ("part", "_ptr", "*fp32"),
                                          ("cols", "", "i32"), ("split_blocks", "", "i32"),
                                          ("splits", "", "i32"))}}
FP32_LINEAR = {f"{name}{i}_ptr": "*fp32" for i in range(decoder_triton.LINEAR_GROUP_MAX)
               for name in ("w", "bias", "out")}
variants(decoder_triton._linear_kernel, LINEAR_ARGS,  # q / k / v: q and v split, k biased
         {"WEIGHTS": 3, "HAS_BIAS0": False, "SPLIT0": True, "HAS_BIAS1": True, "SPLIT1": False,
          "HAS_BIAS2": False, "SPLIT2": True, "BLOCK_M": decoder_triton.LINEAR_BLOCK_M,
          "BLOCK_N": 64, "BLOCK_K": 64, "DOT_PRECISION": "tf32", "UPCAST": False},
         one_weight_one_row={"WEIGHTS": 1, "SPLIT0": False, "HAS_BIAS0": True, "rows": 1,
                            "part0_ptr": "*bf16"},
         rows_16={"BLOCK_M": 16, "WEIGHTS": 2},
         fp32={"x_ptr": "*fp32", **FP32_LINEAR, "DOT_PRECISION": "ieee"})
variants(decoder_triton._sum_splits_kernel,
         {**{f"{name}{i}{ptr}": kind for i in range(decoder_triton.LINEAR_GROUP_MAX)
             for name, ptr, kind in (("part", "_ptr", "*fp32"), ("bias", "_ptr", "*bf16"),
                                     ("out", "_ptr", "*bf16"), ("count", "", "i32"),
                                     ("cols", "", "i32"), ("splits", "", "i32"))}},
         {"WEIGHTS": 3, "HAS_BIAS0": True, "HAS_BIAS1": False, "HAS_BIAS2": True,
          "BLOCK": decoder_triton.LINEAR_SUM_BLOCK, "UPCAST": False},
         one_weight_fp16={"WEIGHTS": 1, "HAS_BIAS0": False, "bias0_ptr": "*fp16",
                          "out0_ptr": "*fp16"})
variants(decoder_triton._rms_norm_kernel,
         {"x_ptr": "*bf16", "residual_ptr": "*bf16", "weight_ptr": "*bf16", "out_ptr": "*bf16",
          "total_ptr": "*bf16", "width": "i32", "eps": "fp32"},
         {"HAS_RESIDUAL": True, "BLOCK": 4096, "UPCAST": False},
         fp32_no_residual={"HAS_RESIDUAL": False, "x_ptr": "*fp32", "residual_ptr": "*fp32",
                           "weight_ptr": "*fp32", "out_ptr": "*fp32", "total_ptr": "*fp32",
                           "BLOCK": 1024})
variants(decoder_triton._rope_kernel,
         {"x_ptr": "*bf16", "positions_ptr": "*i64", "cos_ptr": "*bf16", "sin_ptr": "*bf16",
          "out_ptr": "*bf16", "heads": "i32", "table_rows": "i32"},
         {"DIM": 128, "BLOCK_H": 32, "BLOCK_D": 128, "UPCAST": False},
         fp32_padded={"x_ptr": "*fp32", "cos_ptr": "*fp32", "sin_ptr": "*fp32",
                      "out_ptr": "*fp32", "DIM": 80, "BLOCK_H": 16, "heads": 1})
variants(decoder_triton._silu_mul_kernel,
         {"gate_ptr": "*bf16", "up_ptr": "*bf16", "out_ptr": "*bf16", "count": "i32"},
         {"BLOCK": 1024, "UPCAST": False},
         fp32={"gate_ptr": "*fp32", "up_ptr": "*fp32", "out_ptr": "*fp32"})
build(loss._soft_ce_forward_kernel,
      {"x_ptr": "*bf16", "y_ptr": "*bf16", "loss_ptr": "*fp32", "stats_ptr": "*fp32",
       "rows": "i32", "vocab": "i32"}, {"NEG_BIG": -1.0e30, "BLOCK": 4096})
build(loss._soft_ce_backward_kernel,
      {"x_ptr": "*bf16", "y_ptr": "*bf16", "stats_ptr": "*fp32", "grad_loss_ptr": "*fp32",
       "grad_x_ptr": "*bf16", "rows": "i32", "vocab": "i32"}, {"BLOCK": 4096})

print(f"triton {triton.__version__}: every specialization compiled for sm_90")
if TOO_MUCH_SHARED:
    raise SystemExit("over the H100's shared memory per block "
                     f"({H100_SHARED_BYTES} B): " + "; ".join(TOO_MUCH_SHARED))
