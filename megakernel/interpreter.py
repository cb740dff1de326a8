"""Choosing the Triton interpreter, which runs generated kernels on CPU tensors.

Triton decides between compiling and interpreting when it is imported and when functions are
decorated, so the choice must be made before anything imports triton."""
import os
import sys


def ensure_interpreter() -> None:
    if os.environ.get("TRITON_INTERPRET") == "1":
        return
    if "triton" in sys.modules:
        raise RuntimeError("running the megakernel on the CPU needs the Triton interpreter: set "
                           "TRITON_INTERPRET=1 before triton is imported")
    os.environ["TRITON_INTERPRET"] = "1"


def kernel_target(device_type: str) -> str:
    """The compile target (a key of ``compiler.cost.TARGETS``) for tensors on ``device_type``;
    for the CPU this also selects the interpreter, so call it before anything imports triton."""
    if device_type == "cpu":
        ensure_interpreter()
        return "cpu"
    return "h200"
