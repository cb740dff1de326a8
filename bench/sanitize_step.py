"""One megakernel step of tiny-llama on the GPU, for ``compute-sanitizer --tool memcheck``.

    compute-sanitizer --tool memcheck python -m megakernel.bench.sanitize_step
        [--attn-stream] [--kv-block 64] [--attn-pairs [--attn-group 4 | --pair-ranges]]
        [--norm-sums] [--staged-kib 8]
"""
import argparse
from dataclasses import replace

import torch

from megakernel.compiler.tile import TileConfig
from megakernel.models import PRESETS, load_model, random_model
from megakernel.runtime import allocate_kv_cache
from megakernel.runtime.megakernel import megakernel_backend


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--attn-stream", action="store_true", help="TileConfig.attn_stream")
    p.add_argument("--attn-pairs", action="store_true",
                   help="TileConfig.attn_pairs (with 64 keys per task: each unit one task)")
    p.add_argument("--kv-block", type=int, default=TileConfig.kv_block,
                   help="TileConfig.kv_block (64: one block-table entry per attention step)")
    p.add_argument("--attn-group", type=int, default=TileConfig.attn_group,
                   help="TileConfig.attn_group (more than 2: tiny-llama with 4 kv heads)")
    p.add_argument("--pair-ranges", action="store_true",
                   help="TileConfig.attn_pair_ranges (32 keys per task: two ranges a unit)")
    p.add_argument("--norm-sums", action="store_true",
                   help="TileConfig.norm_sums (with norm first and 2 K slices)")
    p.add_argument("--staged-kib", type=int, default=0,
                   help="TileConfig.staged_kib (projections in whole K: each task stages)")
    args = p.parse_args(argv)
    if args.attn_group > 2:
        cfg = replace(PRESETS["tiny-llama"], num_heads=8, num_kv_heads=4)
        model = random_model(cfg, "cuda", torch.bfloat16)
    else:
        model = load_model("tiny-llama", device="cuda", dtype="bfloat16", progress=False).model
    cache = allocate_kv_cache(model.config, 3, 64, dtype=torch.bfloat16, device="cuda")
    step = megakernel_backend(model, cache, num_workers=24,
                              tile=TileConfig(attn_stream=args.attn_stream,
                                              kv_block=args.kv_block,
                                              attn_pairs=args.attn_pairs,
                                              attn_group=args.attn_group,
                                              attn_pair_ranges=args.pair_ranges,
                                              attn_tasks_per_worker=0 if args.pair_ranges else
                                              TileConfig.attn_tasks_per_worker,
                                              kv_split=max(32 if args.pair_ranges else
                                                           TileConfig.kv_split, args.kv_block),
                                              staged_kib=args.staged_kib,
                                              **(dict(norm_first=True, split_k=2, norm_sums=True)
                                                 if args.norm_sums else
                                                 dict(split_k=1) if args.staged_kib else {})))
    tokens = torch.tensor([[1], [2], [3]], device="cuda")
    positions = torch.tensor([[0], [5], [63]], device="cuda")
    logits = step(tokens, positions, cache)
    torch.cuda.synchronize()
    print("one step done, finite:", bool(torch.isfinite(logits).all()))


if __name__ == "__main__":
    main()
