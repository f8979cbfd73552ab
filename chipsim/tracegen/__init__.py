"""Producing traces: recording routing from a PyTorch MoE model (recorder, checkpoint), training a reduced-width model
of a published shape on open text (textdata, train), fitting the predictors a policy reads (predictors), measuring
what a policy's substitutions cost in quality (quality), and synthetic traces from a model shape (synthetic).

Everything but `synthetic` needs torch (the `trace` extra; install torch==2.13.0 first). `chipsim run` never imports
this package: it reads traces through chipsim.trace.
"""
