"""torch-compile at batch 1 in one process: MODE (inference, nograd or plain grad mode), batch,
and 1 to run eager steps first; copied into bench/ it runs as
`python -m megakernel.bench.probe_tc MODE B E`."""
import sys, contextlib, torch
from megakernel.models import load_model
from megakernel.runtime import get_backend
from megakernel.bench.decode import decode_state, median_step_ms
mode, batch, first_eager = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
model = load_model("llama-3.2-1b", device=torch.device("cuda"), dtype="bfloat16", seed=0).model
tokens, positions, cache = decode_state(model, batch, 1024)
ctx = {"inference": torch.inference_mode, "nograd": torch.no_grad,
       "plain": contextlib.nullcontext}[mode]
dev = cache.device
if first_eager:
    with ctx():
        e = get_backend("eager")(model, cache)
        print("eager", median_step_ms(lambda: e(tokens, positions, cache), dev, 10, 50))
step = get_backend("torch-compile")(model, cache)
with ctx():
    for rep in range(3):
        print(mode, batch, "eager-first" if first_eager else "", "torch-compile",
              round(median_step_ms(lambda: step(tokens, positions, cache), dev, 10, 50), 4), flush=True)
