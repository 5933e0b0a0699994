"""titanlite: a modular, PyTorch-native stack for pretraining language models. The package's
layers, from the entry points down to `core`, are in docs/architecture.md."""

__version__ = "0.1.0"
