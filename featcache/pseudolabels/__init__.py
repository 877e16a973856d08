"""Pseudo-labels from cached vision-language similarities (``featcache pseudo-label``).

A stage beside stage one's output: it reads a features file's image (and tile) embeddings and
class-prompt text embeddings, applies a rule (``rules``: VLPL's or AEVLP's) and writes a
pseudo-label file beside the labels file (``featcache.data.pseudofile``), which the losses
that need pseudo-labels (``vlpl``, ``gpr``) train on. ``run`` holds the command's work.
"""
