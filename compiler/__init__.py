"""FX graph to tile tasks to schedule to one persistent kernel (``megakernel.compiler``)."""
