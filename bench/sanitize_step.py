"""One megakernel step of tiny-llama on the GPU, for ``compute-sanitizer --tool memcheck``."""
import torch

from megakernel.models import load_model
from megakernel.runtime import allocate_kv_cache
from megakernel.runtime.megakernel import megakernel_backend


def main() -> None:
    model = load_model("tiny-llama", device="cuda", dtype="bfloat16", progress=False).model
    cache = allocate_kv_cache(model.config, 3, 64, dtype=torch.bfloat16, device="cuda")
    step = megakernel_backend(model, cache, num_workers=24)
    tokens = torch.tensor([[1], [2], [3]], device="cuda")
    positions = torch.tensor([[0], [5], [63]], device="cuda")
    logits = step(tokens, positions, cache)
    torch.cuda.synchronize()
    print("one step done, finite:", bool(torch.isfinite(logits).all()))


if __name__ == "__main__":
    main()
