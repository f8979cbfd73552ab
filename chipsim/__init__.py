"""chipsim: a trace-driven discrete-event simulator of an edge chiplet accelerator for MoE decoding."""

__version__ = "0.1.0"
