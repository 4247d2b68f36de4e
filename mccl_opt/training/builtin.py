"""Built-in workloads: one pipeline stage of Llama 3.1 405B and of DeepSeek-v3 671B
(paper §6.3; every assumption is listed in docs/training.md "Built-in models").

The paper's Table 1 is not available; the collectives are derived here from the models'
public configurations (Llama 3.1 405B: 126 layers, hidden 16384, FFN 53248, 128 query
and 8 KV heads of 128; DeepSeek-v3: 61 layers, hidden 7168, MLA with 128 heads, query
rank 1536, KV rank 512, head dims 128 + 64 rope / 128 value, 256 routed experts of FFN
2048 plus one shared, top-8 routing) and the parallelism their reports describe
(pipeline 16; Llama: tensor 8 inside a host with sequence parallelism and FSDP data
parallelism; DeepSeek: expert parallelism 64 over eight hosts, ZeRO-1 data parallelism
with parameter gathers and gradient reductions overlapped, no tensor parallelism).
"""

from __future__ import annotations

from typing import Any

from ..errors import WorkloadError
from .workload import WORKLOAD_FORMAT, Workload, load_workload

__all__ = ["BUILTIN", "builtin_workload", "llama3_405b", "deepseek_v3"]

PIPELINE = 16
BATCH_TOKENS = 16384          # per data-parallel rank (docs/training.md)
GPU_TFLOPS = 400.0            # sustained bf16 per GPU: ~40 % of an H100/H800's 989 TFLOP/s
BF16, FP8 = 2, 1


def _causal_attention_flops(tokens: int, seq: int, heads: int, qk_dim: int, v_dim: int) -> float:
    """Forward FLOPs of causal attention scores and weighted values (half of the full square)."""
    return tokens * seq * heads * (qk_dim + v_dim)


def llama3_405b(gpus: int, tokens: int = BATCH_TOKENS) -> dict[str, Any]:
    """One stage (8 of 126 layers) of Llama 3.1 405B on ``gpus`` GPUs: TP 8, FSDP over the rest."""
    h, ffn, heads, kv, hd, seq, layers, tp = 16384, 53248, 128, 8, 128, 8192, 8, 8
    p_attn = 2 * h * h + 2 * h * kv * hd
    p_mlp = 3 * h * ffn
    dp = gpus // tp
    act = tokens * h * BF16                          # one activation tensor of the replica
    attn = (2 * p_attn * tokens + _causal_attention_flops(tokens, seq, heads, hd, hd)) / tp
    mlp = 2 * p_mlp * tokens / tp
    shard = (p_attn + p_mlp) * BF16 / tp             # a GPU's slice of a layer's weights

    def tp_block(scale: int, tag: str) -> list[dict[str, Any]]:
        ops = []
        for part, flops in (("attn", attn), ("mlp", mlp)):
            ops += [{"kind": "allgather", "name": f"tp-ag-{part}-{tag}", "bytes": act / tp, "group": "tp"},
                    {"kind": "compute", "name": f"{part}-{tag}", "flops": scale * flops},
                    {"kind": "reducescatter", "name": f"tp-rs-{part}-{tag}", "bytes": act, "group": "tp"}]
        return ops

    fsdp_ag = {"kind": "allgather", "bytes": shard / dp, "group": "dp", "overlap": True}
    return {
        "format": WORKLOAD_FORMAT, "name": "llama3-405b", "gpu_tflops": GPU_TFLOPS,
        "groups": [{"name": "tp", "size": tp}, {"name": "dp", "size": "rest"}],
        "phases": [
            {"name": "forward", "repeat": layers,
             "ops": [{**fsdp_ag, "name": "fsdp-ag-fwd"}, *tp_block(1, "fwd")]},
            {"name": "backward", "repeat": layers,
             "ops": [{**fsdp_ag, "name": "fsdp-ag-bwd"},
                     {"kind": "reducescatter", "name": "fsdp-rs-grad", "bytes": shard, "group": "dp",
                      "overlap": True},
                     *tp_block(2, "bwd")]}],
        "notes": [f"pipeline stage 1/{PIPELINE}: {layers} layers", f"{tokens} tokens per TP group (data-parallel rank)",
                  "bf16 weights, activations and gradients"],
    }


def deepseek_v3(gpus: int, tokens: int = BATCH_TOKENS) -> dict[str, Any]:
    """One stage (4 MoE layers) of DeepSeek-v3 671B on ``gpus`` GPUs: EP 64, ZeRO-1 DP."""
    h, heads, q_rank, kv_rank, nope, rope, vd = 7168, 128, 1536, 512, 128, 64, 128
    experts, topk, moe_ffn, seq, layers, ep = 256, 8, 2048, 4096, 4, 64
    if gpus % ep:
        raise WorkloadError(f"deepseek-v3 places experts on {ep} GPUs per group: --gpus must be a "
                            f"multiple of {ep}, got {gpus}")
    p_mla = (h * q_rank + q_rank * heads * (nope + rope) + h * (kv_rank + rope)
             + kv_rank * heads * (nope + vd) + heads * vd * h)
    p_expert = 3 * h * moe_ffn
    p_dense = p_mla + p_expert + experts * h         # attention, shared expert, router
    per_gpu = tokens                                 # TP 1: every GPU is a data-parallel rank
    attn = 2 * (p_mla + experts * h) * per_gpu + _causal_attention_flops(per_gpu, seq, heads, nope + rope, vd)
    moe = 2 * (topk + 1) * p_expert * per_gpu        # eight routed experts and the shared one
    routed = per_gpu * topk * h                      # a GPU's routed token copies (elements)
    expert_shard = experts // ep * p_expert * BF16

    def a2a(name: str, width: int) -> dict[str, Any]:
        return {"kind": "alltoall", "name": name, "bytes": routed * width, "group": "ep"}

    return {
        "format": WORKLOAD_FORMAT, "name": "deepseek-v3", "gpu_tflops": GPU_TFLOPS,
        "groups": [{"name": "ep", "size": ep}, {"name": "dp", "size": "rest"}],
        "phases": [
            {"name": "forward", "repeat": layers, "ops": [
                {"kind": "allgather", "name": "zero-ag-experts", "bytes": expert_shard / (gpus // ep),
                 "group": "dp", "overlap": True},
                {"kind": "allgather", "name": "zero-ag-dense", "bytes": p_dense * BF16 / gpus,
                 "group": "world", "overlap": True},
                {"kind": "compute", "name": "attn-fwd", "flops": attn},
                a2a("dispatch-fwd", FP8),
                {"kind": "compute", "name": "experts-fwd", "flops": moe},
                a2a("combine-fwd", BF16)]},
            {"name": "backward", "repeat": layers, "ops": [
                {"kind": "reducescatter", "name": "zero-rs-experts", "bytes": expert_shard, "group": "dp",
                 "overlap": True},
                {"kind": "reducescatter", "name": "zero-rs-dense", "bytes": p_dense * BF16, "group": "world",
                 "overlap": True},
                a2a("combine-bwd", BF16),
                {"kind": "compute", "name": "experts-bwd", "flops": 2 * moe},
                a2a("dispatch-bwd", BF16),
                {"kind": "compute", "name": "attn-bwd", "flops": 2 * attn}]}],
        "notes": [f"pipeline stage 1/{PIPELINE}: {layers} MoE layers", f"{tokens} tokens per GPU (data-parallel rank)",
                  "uniform routing (no node limit), FP8 dispatch, bf16 combine and gradients"],
    }


BUILTIN = {"llama3-405b": llama3_405b, "deepseek-v3": deepseek_v3}


def builtin_workload(name: str, gpus: int) -> Workload:
    """A built-in model's stage for ``gpus`` GPUs, validated."""
    if name not in BUILTIN:
        raise WorkloadError(f"unknown built-in model {name!r}; choose one of {sorted(BUILTIN)} "
                            "or give a mccl-workload/1 file")
    if not isinstance(gpus, int) or gpus < 2:
        raise WorkloadError(f"--gpus must be an integer >= 2, got {gpus!r}")
    return load_workload(BUILTIN[name](gpus))
